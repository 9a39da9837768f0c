"""Channel groups, transports, biases and the temperature of a scheme: checked, classified, laid out."""

from __future__ import annotations

from pedsl.errors import did_you_mean
from pedsl.lang import ast
from pedsl.lang.builtins import FUNCTIONS
from pedsl.lang.channels import channel_ranges, group_channels
from pedsl.lang.dense import dense_rotation
from pedsl.lang.fold import fold_expr
from pedsl.lang.exprs import calls_in, distance_coefficient, inline_lets, neg, split_terms, to_source, uses_name, walk
from pedsl.lang.stage import FAILED, ResolverStage
from pedsl.lang.scheme import ChannelGroup, DistanceBias, GateBias, HouseholderSteps, RotateTransport, RotationSteps
from pedsl.lang.types import Dep, Ty
from pedsl.lang.values import DYNAMIC, EvalIssue, GroupSpec, StaticEnv
from pedsl.limits import MAX_LENGTH


class TermResolution(ResolverStage):
    """The Resolver's layout stage: channel groups, then the transports, biases and temperature over them."""

    _failed_groups: set[str]  # set by the Resolver

    def resolve_groups(self, env: StaticEnv, head_dim: int) -> dict[str, ChannelGroup]:
        groups: dict[str, ChannelGroup] = {}
        if self.m.channels is None:
            groups["all"] = ChannelGroup(name="all", channels=tuple(range(head_dim)), spec="all")
            return groups
        loc = self.m.channels
        self._current = loc.src
        taken: set[int] = set()
        rest_groups: list[ast.Group] = []
        chk = self.checker()
        for g in loc.stmt.groups:
            self._failed_groups.add(g.name)  # until it resolves; its transports then stay quiet
            if g.name in groups or g.name in [r.name for r in rest_groups]:
                self.report("E205", f"channel group '{g.name}' is declared twice", g)
                continue
            t = chk.infer(g.spec)
            if t is None:
                continue
            if t.kind != "group":
                self.report("E204", f"channel group '{g.name}' needs a layout (all, rest, fraction(f), "
                            f"quarters(a, b), range(a, b)), not {t.show()}", g.spec)
                continue
            spec = self.fold_or_report(g.spec, env)
            if spec is FAILED:
                continue
            if isinstance(spec, GroupSpec) and spec.kind == "rest":
                rest_groups.append(g)
                self._failed_groups.discard(g.name)
                continue
            try:
                chans = group_channels(spec, head_dim, taken)
            except EvalIssue as issue:
                self.report("E210", f"channel group '{g.name}': {issue}", g.spec, hint=issue.hint)
                continue
            overlap = taken & set(chans)
            if overlap:
                self.report("E211", f"channel group '{g.name}' overlaps another group (channels "
                            f"{channel_ranges(sorted(overlap))})", g.spec)
                continue
            taken |= set(chans)
            groups[g.name] = ChannelGroup(name=g.name, channels=tuple(chans), spec=to_source(g.spec))
            self._failed_groups.discard(g.name)
        for g in rest_groups:
            chans = [c for c in range(head_dim) if c not in taken]
            taken |= set(chans)
            groups[g.name] = ChannelGroup(name=g.name, channels=tuple(chans), spec="rest")
        return groups

    def resolve_transports(self, env: StaticEnv, lets, groups: dict[str, ChannelGroup]) -> list:
        out = []
        used: dict[int, str] = {}
        for loc in self.m.transports:
            st: ast.Transport = loc.stmt
            self._current = loc.src
            gname = st.group or "all"
            if gname == "all" and "all" not in groups:
                head_dim = len({c for g in groups.values() for c in g.channels}) or self.structural["head_dim"]
                group = ChannelGroup(name="all", channels=tuple(range(int(self.values.get("head_dim", head_dim)))),
                                     spec="all")
            elif gname not in groups:
                if gname in self._failed_groups:
                    continue  # its declaration was reported already
                hint = did_you_mean(gname, groups) or ("declare it in a channels { ... } block" if groups else None)
                self.report("E211", f"unknown channel group '{gname}'", st, hint=hint)
                continue
            else:
                group = groups[gname]
            if st.value.kind == "name" and st.value.id == "none":
                continue
            t = self.checker().infer(st.value)
            if t is None:
                continue
            if t.kind != "transport":
                self.report("E204", f"a {st.targets} line needs a transport (rotate(...) or accumulate(...)), "
                            f"not {t.show()}", st.value)
                continue
            clash = sorted(c for c in group.channels if c in used)
            if clash:
                self.report("E214", f"two transports act on channels {channel_ranges(clash)} (groups '{used[clash[0]]}' "
                            f"and '{gname}')", st, hint="give each transport its own channel group")
                continue
            for c in group.channels:
                used[c] = gname
            if len(group.channels) % 2 and "householder" not in t.detail:
                self.report("E210", f"group '{gname}' has {len(group.channels)} channels; rotations need pairs", st)
                continue
            value = inline_lets(st.value, lets)
            if gname == "all" and "all" not in groups:
                groups["all"] = group
            out.append(self._classify(st, value, t, gname, env, group))
        return [x for x in out if x is not None]

    def check_shared_widths(self, transports: list, groups: dict[str, ChannelGroup]) -> None:
        """A let's learned value is one site (docs/language.md, let): one holding a value per pair or
        channel has the width of one channel group, so it cannot serve groups of different sizes."""
        seen: dict[str, tuple[str, int]] = {}  # let -> (first group, its channels)
        for t in transports:
            width = len(groups[t.group].channels)
            exprs = {"rotate": ("phase",), "accumulate_rotation": ("angle",), "dense_rotation": ()}.get(t.kind, ("w", "beta"))
            for node in (n for f in exprs for n in walk(getattr(t, f))):
                if not isinstance(node, ast.Call) or node.bound is None:
                    continue
                axes = self.type_of(node).axes
                if not axes & {"pair", "chan"}:
                    continue
                let = node.bound[0]
                first = seen.setdefault(let, (t.group, width))
                if first[1] != width:
                    loc = self.m.lets[let]
                    self.report("E204", f"'{let}' holds one learned value per {'pair' if 'pair' in axes else 'channel'} "
                                f"of a group, and a let is one value: it cannot serve group '{first[0]}' "
                                f"({first[1]} channels) and group '{t.group}' ({width} channels)", loc.stmt,
                                src=loc.src, hint="write one let per group (each its own learned value), or give "
                                "the groups one size")
                    return

    def _classify(self, st: ast.Transport, value: ast.Expr, t: Ty, gname: str, env: StaticEnv, group: ChannelGroup):
        fn = value
        if fn.kind == "call" and fn.func == "rotate":
            phase = _arg(fn, "phase")
            self._check_static(phase, env, len(group.channels) // 2)
            self._check_axis_selections(phase, env, len(group.channels) // 2)
            scale_expr = next((kw.value for kw in fn.kwargs if kw.name == "scale"),
                              fn.args[1] if len(fn.args) > 1 else None)
            scale = self._rotate_scale(scale_expr, st, env)
            if scale is None:
                return None
            return RotateTransport(targets=st.targets, group=gname, phase=phase, phase_ty=self.type_of(phase),
                                   scale=scale, scale_expr=scale_expr)
        if fn.kind == "call" and fn.func == "xpos":
            return self._xpos(st, fn, gname, env, group)
        if fn.kind == "call" and fn.func == "dense_rotation":
            return dense_rotation(self, st, fn, group, env, max(1, len(self.m.axes.stmt.names) if self.m.axes else 1))
        if fn.kind == "call" and fn.func == "accumulate":
            step = _arg(fn, "step")
            if self._step_reads_query_position(step):
                return None
            if step.kind == "call" and step.func == "rotation":
                angle = _arg(step, "angle")
                self._check_static(angle, env, len(group.channels) // 2)
                self._check_axis_selections(angle, env, len(group.channels) // 2)
                return RotationSteps(targets=st.targets, group=gname, angle=angle, angle_ty=self.type_of(angle))
            if step.kind == "call" and step.func == "householder":
                w, beta = _arg(step, "w"), _arg(step, "beta")
                try:
                    bval = fold_expr(beta, env)
                except EvalIssue:
                    bval = DYNAMIC
                ortho = isinstance(bval, (int, float)) and bval in (0, 2)
                return HouseholderSteps(targets=st.targets, group=gname, w=w, beta=beta, w_ty=self.type_of(w),
                                        beta_ty=self.type_of(beta), orthogonal=ortho)
        self.report("E204", "write a transport as rotate(PHASE), accumulate(rotation(ANGLE)), "
                    "accumulate(householder(w = ..., beta = ...)) or dense_rotation(...)", st.value)
        return None

    def _xpos(self, st: ast.Transport, fn: ast.Call, gname: str, env: StaticEnv, group: ChannelGroup):
        """xpos(phase, gamma, zeta): a rotation whose pairs also decay with the distance (a static gamma > 0
        and zeta > 0, on q and k only: a value scaled by zeta^(-j/gamma) would not be undone)."""
        phase = _arg(fn, "phase")
        self._check_static(phase, env, len(group.channels) // 2)
        got = {}
        names = [p for p, _ in FUNCTIONS["xpos"].params]
        for name, default in FUNCTIONS["xpos"].params[1:]:
            at = names.index(name)
            expr = next((kw.value for kw in fn.kwargs if kw.name == name), fn.args[at] if len(fn.args) > at else None)
            if expr is None:
                assert isinstance(default, (int, float))  # xpos's record: gamma and zeta default to numbers
                got[name] = float(default)
                continue
            value = self.fold_or_report(expr, env)
            if value is FAILED:
                return None
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
                self.report("E217", f"xpos(): {name} must be a positive number, got {value!r}", expr,
                            hint="gamma is the scale base (512 in the paper), zeta the decay offset (0.4)")
                return None
            got[name] = float(value)
        if st.targets == "qkv":
            self.report("E204", "xpos() scales q and k by inverse factors; it cannot go with value rotation (qkv)",
                        fn, hint="write 'qk:'")
            return None
        return RotateTransport(targets=st.targets, group=gname, phase=phase, phase_ty=self.type_of(phase),
                               xpos_gamma=got["gamma"], xpos_zeta=got["zeta"])

    def type_of(self, e: ast.Expr) -> Ty:
        """The checker's type of a resolved (let-inlined) expression, stored with it on the IR."""
        t = self.checker().infer(e)
        assert t is not None, "a checked expression failed to type once its lets were inlined"
        return t

    def _rotate_scale(self, expr: ast.Expr | None, st: ast.Transport, env: StaticEnv) -> float | None:
        """The static value of rotate(..., scale = S) (1 when absent); None after reporting an error."""
        if expr is None:
            return 1.0
        value = self.fold_or_report(expr, env)
        if value is FAILED:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            self.report("E217", f"rotate(): scale must be a positive number, got {value!r}", expr)
            return None
        if st.targets == "qkv" and value != 1:
            self.report("E204", "rotate(): a scale applies to q and k only; it cannot go with value rotation (qkv)",
                        expr, hint="write 'qk:' or drop the scale")
            return None
        return float(value)

    def _check_static(self, e: ast.Expr, env: StaticEnv, pairs: int) -> None:
        """Evaluate the static parts (grids) once so their errors show up at check time."""
        try:
            fold_expr(e, env.child(pairs=pairs))
            # Probe once at position 1 so math errors in static parts mixed with the position
            # (e.g. "position / factor" with factor = 0) surface at check time too.
            probe = StaticEnv(values={**env.values, "position": 1}, lets=env.lets, pairs=pairs, n=env.n)
            fold_expr(e, probe)
            # And at the longest sequence pedsl runs: grids that read the length (dynamic_ntk) change there.
            fold_expr(e, StaticEnv(values=env.values, lets=env.lets, pairs=pairs, n=MAX_LENGTH))
        except EvalIssue as issue:
            self.report("E217", str(issue), issue.node or e, hint=issue.hint)

    def _check_axis_selections(self, e: ast.Expr, env: StaticEnv, pairs: int) -> None:
        """Every sections()/interleave() of a rotation: one static size per declared axis, fitting the
        group's pairs (E232 at the call)."""
        axes = self.m.axes.stmt.names if self.m.axes is not None else ()
        for node in walk(e):
            if not isinstance(node, ast.Call) or (select := FUNCTIONS[node.func].axis_select) is None:
                continue
            sizes_expr = _arg(node, "sizes")
            try:
                sizes = fold_expr(sizes_expr, env)
                if not isinstance(sizes, list):
                    raise EvalIssue(f"{node.func}(): the sizes must be a list known at compile time")
                if len(sizes) != len(axes):
                    raise EvalIssue(f"{node.func}(): {len(sizes)} sizes for {len(axes)} axes ({', '.join(axes)})",
                                    hint="give one size per declared axis, in the order of the axes statement")
                select(sizes, pairs)
            except EvalIssue as issue:
                self.report("E232", str(issue), sizes_expr, hint=issue.hint)

    def resolve_bias(self, lets) -> list:
        """The bias's terms; ``self.constant_terms`` gets the terms that depend on neither i - j nor the
        route (dropped: they cancel in the softmax; lint's W106 names them)."""
        self.constant_terms: list[ast.Expr] = []
        value = self.given_value(self.m.bias)
        if value is None:
            return []
        t = self.checker().infer(value)
        if t is None:
            return []
        declared = self.m.axes.stmt.names if self.m.axes is not None else ()
        if not self._axis_biases_fit(value, lets):
            return []
        if t.kind == "num" and not t.axes <= {"head", "dist", "pos"}:
            self.report("E204", f"a bias is a field over head and distance, not {t.show()}", value,
                        hint="e.g. -slopes(heads) * distance, or accumulate(log_sigmoid(linear(x, to = head)))")
            return []
        if t.kind == "num" and "pos" in t.axes and not self._query_position_only(value, lets):
            return []
        if t.kind not in ("num", "bias"):
            self.report("E204", f"a bias must be a number field or accumulate(log-gate), not {t.show()}", value)
            return []
        out: list[GateBias | DistanceBias] = []
        for term in split_terms(inline_lets(value, lets)):
            if term.kind == "call" and term.func == "accumulate":
                gate = _arg(term, "step")
                if self._step_reads_query_position(gate):
                    return []
                out.append(GateBias(log_gate=gate, log_gate_ty=self.type_of(gate)))
            elif term.kind == "unary" and term.operand.kind == "call" and term.operand.func == "accumulate":
                if self._step_reads_query_position(_arg(term.operand, "step")):
                    return []
                gate = neg(_arg(term.operand, "step"))
                out.append(GateBias(log_gate=gate, log_gate_ty=self.type_of(gate)))
            elif "dist" in (ty := self.type_of(term)).axes:
                if self._pair_term_reads_content(term, ty):
                    return []
                # (a slope that reads the query position is no ALiBi slope: the term is a table per query;
                # a term over per-axis distances is evaluated per pair of tokens, never as a slope)
                axes = tuple(a for a in declared if uses_name(term, f"distance.{a}"))
                out.append(DistanceBias(term=term, term_ty=ty, axes=axes,
                                        slope=None if "pos" in ty.axes or axes else distance_coefficient(term)))
            else:
                self.constant_terms.append(term)
        if not self._path_biases_fit(value, out, lets):
            return []
        return out

    def _with_householder(self, lets) -> bool:
        return any("householder" in calls_in(inline_lets(t.stmt.value, lets)) for t in self.m.transports)

    def _path_biases_fit(self, value: ast.Expr, terms: list, lets) -> bool:
        """PaTH's Householder steps attend by their own kernels and decode rule, which add a bias as the
        difference of one coordinate per token (ALiBi's slope * distance, a forget gate's sums): a table or any
        other function of the distance would be silently left out there, so it is refused (E204)."""
        if not any(isinstance(b, DistanceBias) and b.slope is None for b in terms) or not self._with_householder(lets):
            return True
        self.report("E204", "a bias that is not a slope times the distance (a table, a function of the distance or "
                    "of the query position) cannot go with accumulate(householder(...)): PaTH's kernels and decode "
                    "rule add only coordinate biases", value,
                    hint="with PaTH use -slope * distance (ALiBi) or accumulate(log_sigmoid(...)) (a forget gate)")
        return False

    def _axis_biases_fit(self, value: ast.Expr, lets) -> bool:
        """A bias over ``distance.AXIS`` (docs/semantics.md §3a) is evaluated per pair of tokens in blocks of
        queries; PaTH's Householder steps attend by their own kernel and decode rule, which take the
        one-axis coordinate biases only (E204 at the axis distance); reports and returns False then."""
        node = next((n for n in walk(value) if n.kind == "name" and n.id.startswith("distance.")), None)
        if node is None:
            node = next((n for n in walk(inline_lets(value, lets)) if n.kind == "name"
                         and n.id.startswith("distance.")), None)
        if node is None or not self._with_householder(lets):
            return True
        self.report("E204", f"'{node.id}': a bias over per-axis distances cannot go with accumulate(householder(...)) "
                    "(PaTH's blockwise kernel and decode rule add only biases of the one-axis position)", node,
                    hint="rotate by the axes (qk on GROUP: rotate(w * position.AXIS)) with PaTH, or drop the "
                    "Householder steps")
        return False

    def _step_reads_query_position(self, step: ast.Expr) -> bool:
        """An accumulated step (a rotation, a Householder step, a log-gate) belongs to the token t it is
        taken at, between the key and the query: it has no query. ``query_position`` there would silently
        read t's own position, so it is refused (E204) in favour of ``position``, which says just that."""
        node = next((n for n in walk(step) if n.kind == "name" and n.id.partition(".")[0] == "query_position"),
                    None)
        if node is None:
            return False
        self.report("E204", f"an accumulated step cannot read '{node.id}': a step belongs to each token between "
                    "the key and the query, not to the query", node,
                    hint="write position (the position of the token the step is taken at); a term of the query's "
                    "position belongs in a plain bias, e.g. bias = f(query_position) * distance")
        return True

    def _pair_term_reads_content(self, term: ast.Expr, ty: Ty) -> bool:
        """A term over the distance that reads the hidden state or the tokens would need the content of both
        ends of each pair (Shaw, Transformer-XL, DeBERTa-style terms), which no executor evaluates: refused
        (E204) rather than computed by one backend and not by another."""
        reads = [what for dep, what in ((Dep.DATA, "hidden state x"), (Dep.TOKEN, "token ids")) if dep in ty.reads]
        if not reads:
            return False
        self.report("E204", f"a bias term over the distance cannot read the {' or the '.join(reads)}: terms of the "
                    "content at a pair (i, j) are not supported", term,
                    hint="a data-dependent bias is written as a sum of per-token log-gates, "
                    "accumulate(log_sigmoid(linear(x, to = head))); a bias over the distance may read "
                    "learned values and query_position")
        return True

    def _query_position_only(self, value: ast.Expr, lets) -> bool:
        """A bias reads positions only as ``distance`` and ``query_position`` (a bare ``position`` would not
        say whether it is the query's or the key's); reports otherwise."""
        for node in walk(inline_lets(value, lets)):
            if node.kind == "name" and node.id.partition(".")[0] == "position":
                axis = node.id.partition(".")[2]
                self.report("E204", f"a bias cannot read '{node.id}': it would not say whose (the query's or the key's)",
                            node, hint=f"write distance.{axis} (i_{axis} - j_{axis}, per axis)" if axis else
                            "write query_position (the query's position i) or distance (i - j)")
                return False
        return True

    def resolve_temperature(self, lets) -> ast.Expr | None:
        value = self.given_value(self.m.temperature)
        if value is None:
            return None
        t = self.checker().infer(value)
        if t is None:
            return None
        if t.kind != "num" or not t.axes <= {"pos", "head"} or t.data:
            self.report("E204", f"a temperature is a number per query position (and head), not {t.show()}", value,
                        hint="e.g. log_length(train_length) or a constant")
            return None
        return inline_lets(value, lets)

def _arg(call: ast.Call, name: str) -> ast.Expr:
    spec = FUNCTIONS[call.func]
    pnames = [p for p, _ in spec.params]
    for p, a in zip(pnames, call.args):
        if p == name:
            return a
    for kw in call.kwargs:
        if kw.name == name:
            return kw.value
    raise KeyError(name)  # pragma: no cover - the checker guarantees required args
