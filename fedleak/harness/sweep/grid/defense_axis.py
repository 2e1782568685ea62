"""The defense axis of a sweep spec: ``[[sweep.defense]]`` tables, each a reference point, a
registered defense with one swept parameter, a fixed defense or a fixed chain, expanded into
:class:`~fedleak.harness.sweep.grid.points.DefenseSetting` values and built as the victim will build
them, so an unknown name, key or value fails when the spec is read.
"""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

from fedleak.harness.sweep.grid.axes import no_unknown_keys, parse_protocols, table_keys, table_list
from fedleak.harness.sweep.grid.points import DefenseSetting, SpecError, UtilitySettings

DEFENSE_KEYS = {"reference", "name", "param", "values", "params", "chain", "label", "users",
                "protocol", "utility"}


def parse_defenses(value: Any) -> list[DefenseSetting]:
    out: list[DefenseSetting] = []
    for i, table in enumerate(table_list(value, "sweep.defense")):
        where = f"sweep.defense[{i}]"
        no_unknown_keys(table, DEFENSE_KEYS, where)
        deployment = _deployment(table, where)
        if table.get("reference"):
            if set(table) - {"reference", "label"}:
                raise SpecError(f"{where}: a reference table takes no other keys than label")
            out.append(replace(DefenseSetting((), str(table.get("label", "no defense")), "none",
                                              strength=0.0, reference=True), **deployment))
        elif "chain" in table:
            out.append(replace(_fixed_chain(table, where), **deployment))
        elif "name" in table:
            out.extend(replace(d, **deployment) for d in _swept(table, where))
        else:
            raise SpecError(f"{where}: give reference = true, a name (with param and values), "
                            "or a chain")
    return out


def _deployment(table: dict[str, Any], where: str) -> dict[str, Any]:
    """A defense table's own ``protocol`` (replacing the grid's for its points) and ``utility``
    (overriding [sweep.utility] fields), popped from ``table`` and checked."""
    out: dict[str, Any] = {}
    if "protocol" in table:
        (out["protocol"],) = parse_protocols([table.pop("protocol")])
    if "utility" in table:
        overrides = table_keys(table.pop("utility"), f"{where}.utility")
        no_unknown_keys(overrides, {f.name for f in fields(UtilitySettings)}, f"{where}.utility")
        try:
            UtilitySettings(**overrides)
        except TypeError as err:
            raise SpecError(f"{where}.utility: {err}") from None
        out["utility"] = tuple(sorted(overrides.items()))
    return out


def _fixed_chain(table: dict[str, Any], where: str) -> DefenseSetting:
    if set(table) - {"chain", "label", "users"}:
        raise SpecError(f"{where}: a chain table takes only chain, label and users")
    specs = [str(s) for s in (table["chain"] if isinstance(table["chain"], list)
                              else [table["chain"]])]
    chain = tuple(_canonical(*_parse(s, where)) for s in specs)
    users = _users(table, where)
    _check_chain(chain, where, users)
    label = str(table.get("label", " + ".join(chain) or "no defense"))
    return DefenseSetting(chain, label, label, reference=not chain,
                          strength=0.0 if not chain else None, users=users)


def _users(table: dict[str, Any], where: str) -> int:
    """``users`` of a defense table: how many users a secure-aggregation chain sums (>= 2)."""
    users = table.get("users", 1)
    if isinstance(users, bool) or not isinstance(users, int) or users < 1:
        raise SpecError(f"{where}: users must be a whole number >= 1, got {users!r}")
    return users


def _swept(table: dict[str, Any], where: str) -> list[DefenseSetting]:
    name = str(table["name"])
    fixed = table_keys(table.get("params", {}), f"{where}.params")
    param = table.get("param")
    values = table.get("values")
    if (param is None) != (values is None):
        raise SpecError(f"{where}: give param and values together")
    users = _users(table, where)
    if param is None:
        chain = (_canonical(name, fixed),)
        _check_chain(chain, where, users)
        return [DefenseSetting(chain, str(table.get("label", chain[0])), name, users=users)]
    if not isinstance(values, list) or not values:
        raise SpecError(f"{where}: values must be a non-empty list")
    param = str(param).replace("_", "-")
    group = str(table.get("label", name))
    out = []
    for index, value in enumerate(values):
        chain = (_canonical(name, {**fixed, param: value}),)
        _check_chain(chain, where, users)
        numeric = isinstance(value, int | float) and not isinstance(value, bool)
        strength = float(value) if numeric else float(index + 1)
        out.append(DefenseSetting(chain, f"{name} {param}={_format(value)}", group, param,
                                  strength, users=users))
    return out


def _parse(text: str, where: str) -> tuple[str, dict[str, Any]]:
    from fedleak.defenses import DefenseConfigError, parse_defense_spec

    try:
        return parse_defense_spec(text)
    except DefenseConfigError as err:
        raise SpecError(f"{where}: {err}") from None


def _canonical(name: str, params: dict[str, Any]) -> str:
    """``name:key=value,...`` with keys in hyphen form, sorted."""
    items = sorted((k.replace("_", "-"), _format(v)) for k, v in params.items())
    return name + (":" + ",".join(f"{k}={v}" for k, v in items) if items else "")


def _format(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _check_chain(chain: tuple[str, ...], where: str, users: int = 1) -> None:
    """Build the chain as the victim will: unknown names, keys or values fail here; secure
    aggregation needs ``users >= 2`` (and only it uses them)."""
    from fedleak.defenses import DefenseConfigError, build_chain, parse_defense_spec

    try:
        built = build_chain([parse_defense_spec(s) for s in chain])
    except DefenseConfigError as err:
        raise SpecError(f"{where}: {err}") from None
    transport = built.transport
    if transport is not None and users < 2:
        raise SpecError(f"{where}: {transport.name} aggregates several users' updates; give the "
                        "table users = K (K >= 2 users, each with batch_size images per round)")
    if transport is None and users != 1:
        raise SpecError(f"{where}: users = {users} needs a secure-aggregation defense (secagg) "
                        "in the chain; a single user's victim has one user")
    if transport is not None:
        try:
            transport.threshold(users)
        except ValueError as err:
            raise SpecError(f"{where}: {err}") from None
