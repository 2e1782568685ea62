"""``.. fedleak-proto::``: the gRPC contract (``protos/**/*.proto``) as reference pages,
generated from the descriptors protoc builds with source information, so every service, RPC,
message, field and enum value appears with the comment the ``.proto`` gives it, and nothing
is written twice. protoc is grpcio-tools' (the same one ``make protos`` runs).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from docutils import nodes
from google.protobuf import descriptor_pb2
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective
from table_nodes import code_spans, literal, table

PROTO_ROOT = Path(__file__).resolve().parents[2] / "protos"

# Field numbers of descriptor.proto, the paths of SourceCodeInfo.Location.
FILE_MESSAGE, FILE_ENUM, FILE_SERVICE, FILE_SYNTAX = 4, 5, 6, 12
MESSAGE_FIELD, MESSAGE_NESTED, MESSAGE_ENUM = 2, 3, 4
ENUM_VALUE, SERVICE_METHOD = 2, 2

F = descriptor_pb2.FieldDescriptorProto
SCALARS = {value: name[len("TYPE_"):].lower() for name, value in F.Type.items()}


def proto_files() -> list[Path]:
    return sorted(PROTO_ROOT.rglob("*.proto"))


def descriptors() -> list[descriptor_pb2.FileDescriptorProto]:
    """The descriptors of every ``.proto`` file, with comments (``--include_source_info``)."""
    from grpc_tools import protoc

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "set.pb"
        args = ["protoc", f"-I{PROTO_ROOT}", "--include_source_info",
                f"--descriptor_set_out={out}", *map(str, proto_files())]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed on {PROTO_ROOT}")
        files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file
    wanted = {str(p.relative_to(PROTO_ROOT)) for p in proto_files()}
    return [f for f in files if f.name in wanted]


def comments(file: descriptor_pb2.FileDescriptorProto) -> dict[tuple[int, ...], str]:
    """Leading and trailing comment of every element, by its path in the descriptor."""
    out = {}
    for location in file.source_code_info.location:
        text = " ".join(part.strip() for part in (location.leading_comments,
                                                  location.trailing_comments) if part.strip())
        if text:
            out[tuple(location.path)] = " ".join(text.split())
    return out


def anchor(full_name: str) -> str:
    return nodes.make_id("proto-" + full_name.lstrip("."))


def type_ref(name: str) -> list[nodes.Node]:
    """A message or enum type as a link to its entry on this page."""
    short = name.rsplit(".", 1)[-1]
    return [nodes.reference("", "", nodes.literal(short, short), internal=True,
                            refid=anchor(name))]


def walk_messages(messages: Any, prefix: str, path: tuple[int, ...]
                  ) -> Iterator[tuple[str, descriptor_pb2.DescriptorProto, tuple[int, ...]]]:
    """Every message (nested ones after their parent) with its full name and path."""
    for index, message in enumerate(messages):
        if message.options.map_entry:
            continue
        name = f"{prefix}.{message.name}"
        here = (*path, index)
        yield name, message, here
        yield from walk_messages(message.nested_type, name, (*here, MESSAGE_NESTED))


class ProtoPage:
    """The nodes of one ``.proto`` file."""

    def __init__(self, file: descriptor_pb2.FileDescriptorProto) -> None:
        self.file = file
        self.notes = comments(file)
        self.maps = {f".{file.package}.{m.name}.{n.name}": n
                     for _, m, _ in walk_messages(file.message_type, f".{file.package}", ())
                     for n in m.nested_type if n.options.map_entry}

    def field_type(self, field: F) -> list[nodes.Node]:
        if field.type_name in self.maps:
            key, value = self.maps[field.type_name].field
            return [nodes.Text("map<"), *self.single_type(key), nodes.Text(", "),
                    *self.single_type(value), nodes.Text(">")]
        kind = self.single_type(field)
        return [nodes.Text("repeated "), *kind] if field.label == F.LABEL_REPEATED else kind

    @staticmethod
    def single_type(field: F) -> list[nodes.Node]:
        if field.type in (F.TYPE_MESSAGE, F.TYPE_ENUM):
            return type_ref(field.type_name)
        return literal(SCALARS[field.type])

    def note(self, path: tuple[int, ...]) -> str:
        return self.notes.get(path, "")

    def entry(self, title: str, full_name: str, path: tuple[int, ...]) -> nodes.section:
        section = nodes.section(ids=[anchor(full_name)])
        section += nodes.title(title, title)
        if self.note(path):
            section += nodes.paragraph("", "", *code_spans(self.note(path)))
        return section

    def services(self) -> Iterator[nodes.section]:
        for index, service in enumerate(self.file.service):
            path = (FILE_SERVICE, index)
            section = self.entry(f"service {service.name}", f".{self.file.package}.{service.name}",
                                 path)
            rows = []
            for m, method in enumerate(service.method):
                request = ([nodes.Text("stream ")] if method.client_streaming else []) \
                    + type_ref(method.input_type)
                response = ([nodes.Text("stream ")] if method.server_streaming else []) \
                    + type_ref(method.output_type)
                rows.append([literal(method.name), request, response,
                             self.note((*path, SERVICE_METHOD, m))])
            section += table(["rpc", "request", "response", "what it does"], rows, [16, 22, 22, 40])
            yield section

    def messages(self) -> Iterator[nodes.section]:
        for name, message, path in walk_messages(self.file.message_type, f".{self.file.package}",
                                                 (FILE_MESSAGE,)):
            section = self.entry(f"message {name.rsplit('.', 1)[-1]}", name, path)
            rows = [[literal(f.name), [nodes.Text(str(f.number))], self.field_type(f),
                     self.note((*path, MESSAGE_FIELD, i))] for i, f in enumerate(message.field)]
            if rows:
                section += table(["field", "number", "type", "meaning"], rows, [22, 8, 22, 48])
            else:
                section += nodes.paragraph("", "No fields.")
            yield section
            for e, enum in enumerate(message.enum_type):
                yield self.enum(enum, name, (*path, MESSAGE_ENUM, e))

    def enums(self) -> Iterator[nodes.section]:
        for index, enum in enumerate(self.file.enum_type):
            yield self.enum(enum, f".{self.file.package}", (FILE_ENUM, index))

    def enum(self, enum: Any, prefix: str, path: tuple[int, ...]) -> nodes.section:
        section = self.entry(f"enum {enum.name}", f"{prefix}.{enum.name}", path)
        rows = [[literal(v.name), [nodes.Text(str(v.number))], self.note((*path, ENUM_VALUE, i))]
                for i, v in enumerate(enum.value)]
        section += table(["value", "number", "meaning"], rows, [30, 10, 60])
        return section

    def section(self) -> nodes.section:
        title = f"{self.file.name} (package {self.file.package})"
        section = nodes.section(ids=[nodes.make_id("proto-file-" + self.file.name)])
        section += nodes.title(title, title)
        if self.note((FILE_SYNTAX,)):
            section += nodes.paragraph("", "", *code_spans(self.note((FILE_SYNTAX,))))
        for part in (*self.services(), *self.messages(), *self.enums()):
            section += part
        return section


class ProtoDirective(SphinxDirective):
    has_content = False

    def run(self) -> list[nodes.Node]:
        for path in proto_files():
            self.env.note_dependency(str(path))
        return [ProtoPage(file).section() for file in descriptors()]


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("fedleak-proto", ProtoDirective)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
