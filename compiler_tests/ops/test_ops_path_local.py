"""PaTH inside a sliding window or chunk (pedsl.ops.path.path_attention_local) against an independent
float64 loop (explicit Householder products over the steps between each key and query, the window as
an explicit condition), forward and gradients (q, k, v, w, beta, the forget gate and the sink), at the
window's boundaries (N = 1, N >= L, N not a multiple of the block), and its memory: nothing of
(L, L) at L = 2000, N = 128."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from compiler_helpers import largest_allocation
from pedsl.ops import path as PA
from pedsl.ops import path_window

F64 = torch.float64
pytestmark = pytest.mark.usefixtures("one_thread")


def _inputs(B=2, H=2, L=23, D=4, seed=0, dtype=F64):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, L, D, generator=g, dtype=dtype) for _ in range(3))
    w = F.normalize(torch.randn(B, H, L, D, generator=g, dtype=dtype), dim=-1)
    beta = 2 * torch.rand(B, H, L, generator=g, dtype=dtype)
    lf = F.logsigmoid(torch.randn(B, H, L, generator=g, dtype=dtype) + 1.0)
    sink = torch.randn(B, H, L, generator=g, dtype=dtype), torch.randn(1, H, 1, D, generator=g, dtype=dtype)
    return q, k, v, w, beta, lf, sink


def _loop(q, k, v, w, beta, lf, sees, sink=None):
    """o_i = sum_j softmax_j(q_i . H_i ... H_(j+1) k_j / sqrt(D) + sum_(j<s<=i) lf_s) v_j over the keys j <= i
    with ``sees(i, j)``, products multiplied out step by step in float64 (plus the sink's logit and value)."""
    B, H, L, D = q.shape
    eye = torch.eye(D, dtype=F64)
    rows = []
    for i in range(L):
        P, scores, keys = eye.expand(B, H, D, D), [], []
        for j in range(i, -1, -1):
            if j < i:
                wt = w[:, :, j + 1]
                P = P - beta[:, :, j + 1, None, None] * (P @ wt.unsqueeze(-1)) * wt.unsqueeze(-2)
            if not sees(i, j):
                continue
            s = (q[:, :, i].unsqueeze(-2) @ P @ k[:, :, j].unsqueeze(-1))[..., 0, 0] / D ** 0.5
            if lf is not None:
                s = s + lf[:, :, j + 1: i + 1].sum(-1)
            scores.append(s)
            keys.append(j)
        if sink is not None:
            scores.append(sink[0][:, :, i])
        if not scores:
            rows.append(torch.zeros_like(q[:, :, i]))
            continue
        a = torch.softmax(torch.stack(scores, -1), -1)
        o = (a[..., : len(keys), None] * v[:, :, keys]).sum(-2)
        if sink is not None:
            o = o + a[..., -1:] * sink[1][:, :, 0]
        rows.append(o)
    return torch.stack(rows, 2)


def _window(N):
    return (lambda i, j: i - j < N), N - 1, None


def _chunk(S):
    return (lambda i, j: i // S == j // S), S - 1, (lambda i, j: (i // S == j // S).unsqueeze(0))


def _grads(out, inputs):
    # drawn in float64 and cast: a float32 run and its float64 reference are weighted by the same numbers
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(9), dtype=torch.float64).to(out.dtype)
    return torch.autograd.grad((out * g).sum(), inputs, allow_unused=True, materialize_grads=True)


CASES = [("window", 1), ("window", 2), ("window", 5), ("window", 8), ("window", 9), ("window", 23),
         ("window", 40), ("chunk", 1), ("chunk", 3), ("chunk", 8), ("chunk", 10), ("chunk", 30)]


@pytest.mark.parametrize("kind, n", CASES, ids=[f"{k}{n}" for k, n in CASES])
@pytest.mark.parametrize("gate, with_sink", [(False, False), (True, False), (True, True)],
                         ids=["plain", "gate", "gate+sink"])
def test_forward_and_gradients_equal_the_float64_loop(kind, n, gate, with_sink):
    """Blocks of 8 steps over 23 tokens: windows and chunks below, at, across and beyond the block."""
    q, k, v, w, beta, lf, sink = _inputs()
    for t in (q, k, v, w, beta, lf, *sink):
        t.requires_grad_(True)
    sees, reach, allowed = _window(n) if kind == "window" else _chunk(n)
    lf_, sink_ = (lf if gate else None), (sink if with_sink else None)
    got = PA.path_attention_local(q, k, v, w, beta, lf_, reach=reach, allowed=allowed, sink=sink_, block_size=8)
    want = _loop(q, k, v, w, beta, lf_, sees, sink_)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-11)
    used = [q, k, v, w, beta] + ([lf] if gate else []) + (list(sink) if with_sink else [])
    for a, b in zip(_grads(got, used), _grads(want, used)):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("kind, n", [("window", 13), ("window", 4), ("chunk", 12), ("chunk", 5)])
def test_groups_of_query_blocks_give_the_float64_loop_and_the_one_group_gradients(kind, n, monkeypatch):
    """Query blocks one per group (the first groups reach back past the sequence's start), window = N and
    chunk = N, with the forget gate and the sink: forward and gradients equal the float64 loop and the
    run with every block in one group."""
    q, k, v, w, beta, lf, sink = _inputs(L=40, seed=2)
    tensors = [t.requires_grad_(True) for t in (q, k, v, w, beta, lf, *sink)]
    sees, reach, allowed = _window(n) if kind == "window" else _chunk(n)

    def run():
        return PA.path_attention_local(*tensors[:6], reach=reach, allowed=allowed, sink=tuple(tensors[6:]),
                                       block_size=4)

    one = run()
    g1 = _grads(one, tensors)
    monkeypatch.setattr(path_window, "GROUP_SCORES", 1)  # one query block per group
    grouped = run()
    torch.testing.assert_close(grouped, one, rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(grouped, _loop(*tensors[:6], sees, tuple(tensors[6:])), rtol=1e-10, atol=1e-11)
    for a, b in zip(_grads(grouped, tensors), g1):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_a_window_as_long_as_the_sequence_is_full_path_attention():
    q, k, v, w, beta, lf, _ = _inputs(L=30, seed=3)
    torch.testing.assert_close(PA.path_attention_local(q, k, v, w, beta, lf, reach=29, block_size=8),
                               PA.path_attention(q, k, v, w, beta, lf, block_size=8), rtol=1e-10, atol=1e-11)


def test_half_precision_runs_in_float32_and_returns_its_dtype():
    q, k, v, w, beta, lf, _ = _inputs(L=20, seed=4)
    want = PA.path_attention_local(q, k, v, w, beta, lf, reach=6, block_size=8)
    got = PA.path_attention_local(*(t.bfloat16() for t in (q, k, v, w, beta)), lf, reach=6, block_size=8)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.double(), want, rtol=0.05, atol=0.05)


def test_no_tensor_grows_as_the_square_of_the_length():
    """Forward and backward at L = 2000, N = 128: the largest allocation is O(L N), far below one (L, L)
    score matrix per head."""
    B, H, L, D, N = 1, 2, 2000, 16, 128
    q, k, v, w, beta, lf, _ = _inputs(B, H, L, D, dtype=torch.float32)
    tensors = [t.requires_grad_(True) for t in (q, k, v, w, beta, lf)]
    most = largest_allocation(lambda: PA.path_attention_local(*tensors, reach=N - 1).sum().backward())
    C = 64
    blocks = -(-L // C)
    assert most <= 8 * B * H * blocks * C * (N + C)  # the scores of one call (float64 gate terms at most)
    assert most < 4 * B * H * L * L / 4


@pytest.mark.parametrize("kind, n", [("window", 6), ("chunk", 6), ("window", 1), ("chunk", 13)])
def test_the_hand_written_backward_passes_gradcheck(kind, n, monkeypatch):
    """Finite differences against the kernel's own backward (q, k, v, w, beta, the gate, the sink's logit
    and value), query blocks one per group, window = N and chunk = N: an independent check of the
    backward, not of autograd through the loop."""
    q, k, v, w, beta, lf, sink = _inputs(B=1, H=2, L=11, D=3, seed=6)
    _, reach, allowed = _window(n) if kind == "window" else _chunk(n)
    monkeypatch.setattr(path_window, "GROUP_SCORES", 1)

    def fn(q, k, v, w, beta, lf, logit, value):
        return PA.path_attention_local(q, k, v, w, beta, lf, reach=reach, allowed=allowed, sink=(logit, value),
                                       block_size=4)

    args = [t.detach().requires_grad_(True) for t in (q, k, v, w, beta, lf, *sink)]
    assert torch.autograd.gradcheck(fn, args, eps=1e-6, atol=1e-7, rtol=1e-6, fast_mode=True)


def _saved_bytes(fn) -> int:
    """Bytes of the distinct storages autograd keeps for the backward while ``fn()`` runs."""
    kept = {}

    def pack(t):
        kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(kept.values())


def test_what_the_forward_keeps_for_the_backward_does_not_grow_with_the_window():
    """L = 2048, D = 16, blocks of 64: the same bytes at N = 64 and N = 512, below 8 C + 10 D + 16 floats
    per token and head (the block quantities, the output, the log-sum-exp). Autograd through every block
    (each group's scores and moved queries) kept 1,424 floats per token and head at N = 512."""
    B, H, L, D, C = 1, 2, 2048, 16, 64
    q, k, v, w, beta, lf, _ = _inputs(B, H, L, D, dtype=torch.float32)
    tensors = [t.requires_grad_(True) for t in (q, k, v, w, beta, lf)]
    kept = [_saved_bytes(lambda: PA.path_attention_local(*tensors, reach=N - 1, block_size=C)) for N in (64, 512)]
    assert kept[0] == kept[1]
    assert kept[1] <= 4 * B * H * L * (8 * C + 10 * D + 16)

