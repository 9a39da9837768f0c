"""The table of every diagnostic code pedsl reports (docs/language.md's table is generated from it)."""

#: Every diagnostic code pedsl reports: code -> (stage, one-line meaning). One line per code; to add
#: one, add its line here (in order), use it, and run ``python -m tools.doc_tables`` to
#: regenerate the table in docs/language.md. ``compiler_tests/test_diagnostic_codes.py`` checks that
#: every code used in pedsl/ is here, every entry is used and documented.
CODES: dict[str, tuple[str, str]] = {
    "E000": ("pedsl", "an error without a more specific code"),
    "E100": ("parse", "a syntax error without a more specific code"),
    "E101": ("parse", "not UTF-8 text, or a control character in the text"),
    "E102": ("parse", "file too large (over 1 MB) or too long (over ~20,000 tokens)"),
    "E103": ("parse", "brackets or an expression nested too deeply"),
    "E104": ("parse", "a name longer than 100 characters"),
    "E110": ("parse", "unexpected character (also: unterminated string)"),
    "E111": ("parse", "unexpected token; says what was expected (and which keywords start a statement)"),
    "E112": ("parse", "unexpected end of file (a `}` missing?)"),
    "E113": ("parse", "a number too large for a float (`1e999`)"),
    "E200": ("check", "a checking error without a more specific code"),
    "E201": ("check", "unknown name (did you mean ...?)"),
    "E202": ("check", "unknown function, or calling something that is not a function"),
    "E203": ("check", "wrong arguments: too many, unknown keyword (did you mean ...?), missing, given twice"),
    "E204": ("check", "type or axes mismatch (the type found and the type needed)"),
    "E205": ("check", "duplicate: param/let/statement/group/scheme declared twice, a let defined in terms of "
                      "itself, a builtin name reused"),
    "E206": ("check", "`extends` an unknown scheme"),
    "E207": ("check", "`extends` cycle (or a chain longer than 64 schemes)"),
    "E208": ("check", "import cycle"),
    "E209": ("check", "missing file (an import, or the file given; also a folder), a name that is neither "
                      "a file nor a library scheme, or an import refused (outside the allowed folders, not a "
                      "`.pe` file, not a regular file, or not parseable)"),
    "E210": ("check", "a channel group does not fit `head_dim` (fraction, quarters, range, odd size)"),
    "E211": ("check", "overlapping channel groups, or an unknown group in `on`"),
    "E212": ("check", "a parameter default violates its constraint"),
    "E213": ("check", "unknown `train`/`eval` key (the keys are the fields of `pedsl.config.TrainConfig` / "
                      "`EvalConfig`)"),
    "E214": ("check", "two transports on the same channels"),
    "E215": ("check", "no scheme in the file, or no scheme of the given name"),
    "E216": ("check", "unknown warning name in `allow`"),
    "E217": ("check", "a value cannot be computed (division by zero, overflow, a grid that does not fit: "
                      "`per_pair` length, `span` faster than its period, ...)"),
    "E218": ("check", "a statement's number that is not known when checking, not of its type or out of its range, "
                      "or given without a statement it acts with (its record's `Known`)"),
    "E223": ("check", "a malformed `relative` statement: not `shaw(...)`, `transformer_xl(...)` or `deberta(...)`, an "
                      "unknown or missing option, or a size that is not an integer known when checking"),
    "E224": ("check", "`relative` content-position terms beside a statement they cannot go with (a transport, a "
                      "temperature, a sink, CoPE, remapped positions, a normaliser other than softmax)"),
    "E230": ("check", "a position axis used but not declared (`position.h` without `axes ..., h`), or declared twice"),
    "E231": ("check", "a bare `position` or `distance` in a scheme with several axes (which axis?)"),
    "E232": ("check", "`sections`/`interleave` sizes that do not fit the group's rotary pairs or the axes"),
    "E234": ("check", "bad `dense_rotation(...)` arguments: a block size that does not divide the group or is not from "
                      "2 to 256, `shared` with `split`, `split` blocks the axes do not divide, `init` not positive"),
    "E235": ("check", "a `dense_rotation(...)` on the values (`qkv`): no executor undoes a dense rotation"),
    "E240": ("check", "a `window`/`chunk` that is not an integer >= 1 known when checking, `window` with `chunk`, "
                      "or an unknown `sink` kind"),
    "E241": ("check", "a malformed `contextual` statement: not `cope(...)`, a `max_pos` that is not an integer "
                      ">= 1 known when checking, an unknown option, or CoPE beside a sink or PaTH"),
    "E242": ("check", "a `normalize` value that is no normaliser (softmax, softmax1, sigmoid, sigmoid(bias = b), "
                      "stick_breaking(current = ...), differential(lambda_init = l)), a sigmoid bias or lambda_init not "
                      "known when checking, or a normaliser beside a statement it cannot go with (a sink, PaTH's transport)"),
    "E243": ("check", "a malformed `remap` block: regimes that overlap or leave a distance uncovered, a bound that is "
                      "not `distance CMP number`, a position that is not per token, or a transport it cannot remap"),
    "E244": ("check", "a malformed `mask` (not causal, bidirectional, prefix(N) with N an integer >= 1 known when "
                      "checking, or spans), or a non-causal mask beside a statement whose meaning is defined only "
                      "for keys before the query (accumulated transports, forget gates, tokens counted, xPos, "
                      "stick-breaking, CoPE)"),
    "E250": ("check", "a malformed `layers` block: an unknown rule (did you mean ...?), bad arguments or value, "
                      "`extends` or a statement other than train/eval/allow beside it"),
    "E251": ("check", "a `layers` rule names an unknown scheme (did you mean ...?)"),
    "E252": ("check", "a part of a `layers` block that has a `layers` block itself, or parts that disagree on "
                      "heads / head_dim"),
    "E253": ("check", "two `layers` rules of the same rank name the same layer"),
    "E254": ("check", "the `layers` rules do not fit the model's layer count (a layer beyond it, or one with no part)"),
    "E255": ("check", "`bucket(distance, bidirectional = true)` under a non-causal mask: the plain distance is |i - j|, "
                      "so later keys never reach T5's upper buckets (use a signed per-axis distance)"),
    "E264": ("check", "`normalize = differential` with an odd number of heads (it pairs head h with h + heads/2) "
                      "or beside a transport of the values"),
    "E300": ("params", "a parameter override error without a more specific code"),
    "E301": ("params", "unknown `-P` parameter"),
    "E302": ("params", "`-P` value of the wrong type"),
    "E303": ("params", "`-P` value violates a constraint"),
    "E400": ("compile", "a valid scheme cannot be lowered as asked"),
    "E401": ("compile", "unknown backend"),
    "E402": ("compile", "the backend asked for cannot run this scheme"),
    "E403": ("compile", "FlexAttention with gradients on CPU (it has no CPU backward)"),
    "E404": ("compile", "Householder steps the blockwise kernel cannot run (several groups, or value transport)"),
    "E405": ("compile", "the scheme reads the hidden state x but no `d_model` was given"),
    "E406": ("compile", "the flex backend asked for, but FlexAttention cannot lower a feature of the scheme"),
    "E410": ("compile", "tensors handed to a compiled module do not fit the scheme"),
    "E500": ("config", "an invalid train/eval/compare configuration (unknown or invalid setting, bad YAML)"),
    "E600": ("data", "training or evaluation data cannot be used"),
    "E700": ("checkpoint", "a checkpoint is missing, truncated, or does not match the run"),
    "E800": ("train", "training stopped (a non-finite loss, ...)"),
    "E900": ("eval", "evaluation or analysis cannot run on the given run directory"),
    "E950": ("output", "an output path cannot be written"),
    "E960": ("pedsl", "a FIFO, device or other non-regular file where a file belongs"),
    "E961": ("hf", "`pedsl import-hf`: the config has something with no exact pedsl form (`mrope_section`, "
                   "per-layer-type rope, another rotary layout, an unknown rope type or key)"),
    "E962": ("hf", "`pedsl export-hf` / `export --hf`: the scheme or model has no Hugging Face equivalent "
                   "(says which part)"),
    "E963": ("hf", "a config.json that cannot be read or lacks what its rope type needs"),
    "E964": ("hf", "`pedsl.hf.use_pedsl_attention`: a scheme or model the adapter does not run"),
    "E965": ("hf", "`pedsl.hf.use_pedsl_attention`: a model that scales its queries by position passed no positions"),
    "E970": ("pedsl", "out of memory: sizes within the caps that this machine cannot hold"),
    "E980": ("pedsl", "a command needs an optional extra that is not installed (`pip install 'pedsl[lsp]'`)"),
    "E981": ("config", "an executor or tracker that cannot be used: `sbatch` refused the job, a Ray address or an "
                       "MLflow store that is malformed, unreachable within its timeout, or not a store"),
    "E990": ("usage", "the command line is wrong (exit code 2)"),
    "E991": ("usage", "malformed `-P` (exit code 2)"),
    "E992": ("usage", "`pedsl diff -P NAME` that neither scheme declares (exit code 2)"),
    "E993": ("eval", "`pedsl diff --numeric` failed to compute the curves of a scheme"),
    "E994": ("usage", "a command-line value over its resource cap (`--threads`, `diff --numeric` sizes; exit code 2)"),
    "E995": ("usage", "an environment switch (`PEDSL_CPU_KERNELS`, `PEDSL_DEBUG`, `PEDSL_NO_CACHE`) set to neither "
                      "on nor off (exit code 2)"),
    "W101": ("lint", "frayed frequencies: a rotated pair's period exceeds the training length"),
    "W102": ("lint", "a temperature without a training length"),
    "W103": ("lint", "value transport on non-orthogonal Householder steps"),
    "W104": ("lint", "accumulated random steps without a spectral gap"),
    "W105": ("lint", "a `let` that nothing uses"),
    "W106": ("lint", "a bias term that does not depend on the distance"),
}
