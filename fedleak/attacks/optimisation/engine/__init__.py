"""The inversion engine of the optimisation attacks, one module per way of running it.

:class:`~fedleak.attacks.optimisation.composed.ComposedInversion` (the presets' engine) builds a
frozen
:class:`~fedleak.attacks.optimisation.engine.problem.InversionProblem` — eq. (1) of
:mod:`fedleak.attacks.optimisation.composed` with its parts, the priors, the pixel box — and hands
it to one loop, picked per run:

========================  ================================================================
module                    runs eq. (1)
========================  ================================================================
``problem``               the frozen problem, its value and gradient; the progress span
``eager``                 first order, R restarts side by side, one Python step each
``captured``              the eager step with device-side state, recorded as a CUDA graph
``compiled``              the eager loop's objective step compiled by ``torch.compile``
``precompiled``           that step saved whole, loaded by later processes without tracing
``step_fingerprint``      the saved step's key: what the traced step reads, not tensor values
``vector_isa``            Inductor's vector-ISA probe, run once per machine and remembered
``convolutions``          oneDNN or ATen's own CPU convolutions, chosen by shape
``first_order``           which first-order loop runs (captured, compiled, eager)
``lbfgs``                 L-BFGS restarts one by one, the closure's evaluation captured
``packed``                P observations × R restarts as rows of one problem
``weighing``              the default's aware and blind parts, the better explainer kept
``initial``               the inits x₀, from a seed
``composed_config``       the options every optimisation attack has
========================  ================================================================

How the R restarts of one observation are replayed — vectorised, in lockstep, one by one — is
:func:`fedleak.attacks.optimisation.restarts.side_by_side`.
"""
