"""Tensor parallelism, model side: two CPU processes (gloo) compute the logits one process does.

Each case builds the same model with TP=2 in two spawned processes and with TP=1 here, and runs
the same prefill and decode step through the real attention backend (torch) and KV pool, the
pool sized for the local KV heads. The ranks must agree bit for bit (they will sample apart
otherwise) and with TP=1 up to float32 summation order.
"""

from __future__ import annotations

import os
import time
import traceback
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
import torch.nn.functional as F

from workbench.attention.context import ForwardContext
from workbench.attention.torch_backend import TorchBackend
from workbench.core import Batch, Req, SamplingParams
from workbench.distributed import SINGLE, TPGroup, close_tp, init_tp
from workbench.kvcache.pool import KVPool
from workbench.kvcache.table import TableManager
from workbench.layers.parallel import RowParallelLinear
from workbench.models import ModelConfig, resolve
from workbench.models.decoder import Decoder
from workbench.models.weights import build_model, to_hf_state_dict

SEQ_LEN = 32
PROMPT_LENS = (5, 11, 1, 8)
# Odd vocabularies, so the last rank's slice is padded
QWEN2_BIAS = dict(
    architectures=["Qwen2ForCausalLM"],
    vocab_size=1001,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
)
QWEN3_INDUCTION = dict(
    architectures=["Qwen3ForCausalLM"],
    vocab_size=1001,
    hidden_size=160,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    rms_norm_eps=1e-6,
    rope_theta=1e6,
    tie_word_embeddings=True,
    workbench_init="induction",
)


def run_model(model, prompts: list[list[int]], next_ids: list[int]) -> np.ndarray:
    """Logits of a prefill of `prompts` and of one decode step on `next_ids`, stacked."""
    cfg, attn = model.model_cfg, model.layers[0].self_attn
    pool = KVPool(
        cfg.num_layers,
        len(prompts) * SEQ_LEN,
        1,
        attn.num_kv_heads,
        attn.head_dim,
        torch.float32,
        torch.device("cpu"),
    )
    table = TableManager(len(prompts), SEQ_LEN, torch.device("cpu"))
    backend = TorchBackend(pool, table, num_heads=attn.num_heads, head_dim=attn.head_dim)
    ctx = ForwardContext(backend)
    reqs = []
    for row, prompt in enumerate(prompts):
        table.write_row(row, 0, np.arange(row * SEQ_LEN, (row + 1) * SEQ_LEN, dtype=np.int32))
        reqs.append(Req(row, list(prompt), len(prompt), row, 0, SamplingParams(4), None))

    def forward(batch: Batch, ids: list[int]) -> torch.Tensor:
        batch.snapshot()  # the ledger as launched, which the backend reads
        rows = np.repeat([r.table_idx for r in batch.reqs], [r.extend_len for r in batch.reqs])
        positions = np.concatenate([np.arange(r.cached_len, r.device_len) for r in batch.reqs])
        batch.input_ids = torch.tensor(ids, dtype=torch.int32)
        batch.positions = torch.from_numpy(positions)
        batch.out_loc = torch.from_numpy(table.page_table_host[rows, positions].astype(np.int64))
        batch.sample_idx = torch.from_numpy(np.cumsum([r.extend_len for r in batch.reqs]) - 1)
        backend.prepare(batch)
        with torch.inference_mode(), ctx.running(batch):
            logits = model(batch.input_ids, batch.positions, ctx, batch.sample_idx)
        for r in batch.reqs:
            r.complete_one()
        return logits

    prefill = forward(Batch(reqs, "prefill"), [t for p in prompts for t in p])
    decode = forward(Batch(reqs, "decode"), next_ids)
    return torch.cat([prefill, decode]).numpy()


def inputs(vocab_size: int, seed: int = 0) -> tuple[list[list[int]], list[int]]:
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, vocab_size, n).tolist() for n in PROMPT_LENS]
    return prompts, rng.integers(0, vocab_size, len(prompts)).tolist()


def build(spec: dict, tp: TPGroup) -> np.ndarray:
    """One case's logits: `spec` names a config (catalog name or dict) and its weights."""
    if isinstance(spec["config"], str):  # a catalog model: its config and safetensors
        weights = resolve(spec["config"])
        cfg = ModelConfig.from_dir(weights)
    else:
        cfg, weights = ModelConfig.from_dict(spec["config"]), spec.get("weights")
    model = build_model(cfg, SEQ_LEN, torch.device("cpu"), torch.float32, weights, 7, tp)
    return run_model(model, *inputs(cfg.vocab_size))


CASES = {
    "tiny-llama": dict(config="tiny-llama"),  # tied embeddings, from safetensors
    "tiny-qwen3": dict(config="tiny-qwen3"),  # q/k norm, separate LM head, from safetensors
    "qwen2-bias-drawn": dict(config=QWEN2_BIAS),  # init_dummy: same draws as TP=1
    "qwen2-bias-loaded": dict(config=QWEN2_BIAS, weights="<qwen2 dir>"),  # q/k/v bias, padding
    "qwen3-induction": dict(config=QWEN3_INDUCTION),  # planted weights, tied, padding
}


# -- the spawned side ----------------------------------------------------------------------
def _entry(rank: int, queue, store: str, timeout_s: float, fn, args) -> None:
    torch.set_num_threads(1)  # NOTE: two processes on a 2-core machine; more threads thrash
    try:
        tp = init_tp(rank, 2, "gloo", f"file://{store}", timedelta(seconds=timeout_s))
        try:
            queue.put((rank, fn(tp, *args), None))
        finally:
            close_tp(tp)
    except BaseException:
        queue.put((rank, None, traceback.format_exc()))


def _all_cases(tp: TPGroup, cases: dict) -> dict[str, np.ndarray]:
    out = {name: build(spec, tp) for name, spec in cases.items()}
    # no model above has a row-parallel bias: one layer, against the whole matmul
    gen = torch.Generator().manual_seed(0)
    weight, bias, x = (torch.randn(*s, generator=gen) for s in ((3, 8), (3,), (5, 8)))
    layer = RowParallelLinear(8, 3, bias=True, tp=tp)
    layer.load_shard("weight", weight)
    layer.load_shard("bias", bias)
    local_x = x[:, tp.rank * 4 : (tp.rank + 1) * 4]
    with torch.no_grad():
        out["row-parallel-bias"] = (layer(local_x) - F.linear(x, weight, bias)).numpy()
    # gathering along the first dimension too: rank r's rows r * 5 ...
    rows = tp.all_gather(torch.full((5, 2), float(tp.rank)), dim=0)
    out["gather-rows"] = rows[:, 0].numpy()
    return out


def _peer_fails(tp: TPGroup, how: str) -> tuple[str, float]:
    if tp.rank == 1:
        if how == "dies":
            time.sleep(0.5)  # rank 0 is waiting in the all-reduce by then
            os._exit(1)
        time.sleep(60)  # stalls: alive, but never joins the collective (killed before)
    start = time.monotonic()
    try:
        tp.all_reduce(torch.ones(4))
    except RuntimeError as exc:
        return f"raised: {exc}", time.monotonic() - start
    return "returned", time.monotonic() - start


def spawn(tmp: Path, fn, args, ranks=(0, 1), timeout_s: float = 60, wait_s: float = 120):
    """Run `fn(tp, *args)` on ranks 0 and 1; the results of `ranks` (a failure re-raised)."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    store = str(tmp / f"store-{time.monotonic_ns()}")
    procs = [
        ctx.Process(target=_entry, args=(rank, queue, store, timeout_s, fn, args), daemon=True)
        for rank in (0, 1)
    ]
    for p in procs:
        p.start()
    results = {}
    try:
        deadline = time.monotonic() + wait_s
        while set(results) != set(ranks):
            rank, out, error = queue.get(timeout=max(1.0, deadline - time.monotonic()))
            if error is not None:
                raise AssertionError(f"rank {rank} failed:\n{error}")
            results[rank] = out
    finally:
        for rank, p in enumerate(procs):
            p.join(timeout=10 if rank in results else 0)
            if p.is_alive():
                p.kill()
    return [results[r] for r in ranks]


# -- the tests -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tp_logits(tmp_path_factory) -> dict[str, tuple[np.ndarray | None, list[np.ndarray]]]:
    """Each case: (TP=1 logits, [rank 0's, rank 1's] TP=2 logits); the layer checks: (None,
    each rank's result)."""
    tmp = tmp_path_factory.mktemp("tp")
    from safetensors.torch import save_file

    cfg = ModelConfig.from_dict(QWEN2_BIAS)
    drawn = build_model(cfg, SEQ_LEN, torch.device("cpu"), torch.float32, None, seed=7)
    save_file(
        {k: v.contiguous().clone() for k, v in to_hf_state_dict(drawn).items()},
        tmp / "model.safetensors",
    )
    cases = {n: {**s, "weights": tmp} if "weights" in s else s for n, s in CASES.items()}
    ranks = spawn(tmp, _all_cases, (cases,))
    one = {name: build(spec, SINGLE) for name, spec in cases.items()}
    return {name: (one.get(name), [r[name] for r in ranks]) for name in ranks[0]}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.slow  # ~15 s; two ranks' tokens against HF: test_tp.py
def test_tp2_logits_match_tp1(tp_logits, case):
    """Full logits on every rank (the padding cut off), equal across ranks, and equal to the
    one-process model's to float32 rounding (the all-reduce sums in another order)."""
    one, (rank0, rank1) = tp_logits[case]
    assert rank0.shape == one.shape == (2 * len(PROMPT_LENS), one.shape[1])
    np.testing.assert_array_equal(rank0, rank1)
    scale = float(np.abs(one).max())
    assert np.abs(rank0 - one).max() <= 1e-5 * max(1.0, scale), np.abs(rank0 - one).max()
    assert (rank0.argmax(-1) == one.argmax(-1)).all()


def test_row_parallel_bias_added_once_and_gather_along_rows(tp_logits):
    _, diffs = tp_logits["row-parallel-bias"]
    assert all(np.abs(d).max() < 1e-5 for d in diffs)
    _, gathered = tp_logits["gather-rows"]
    assert all((g == [0] * 5 + [1] * 5).all() for g in gathered)


@pytest.mark.parametrize(
    "how", ["dies", pytest.param("stalls", marks=pytest.mark.slow)]
)  # a stall waits out the whole timeout: with -m slow
def test_a_failed_peer_raises_within_the_timeout(tmp_path, how):
    """Rank 1 exits (or hangs) while rank 0 waits in an all-reduce: rank 0 raises, within the
    group's timeout, instead of waiting for ever."""
    [(outcome, waited)] = spawn(tmp_path, _peer_fails, (how,), ranks=(0,), timeout_s=3)
    assert outcome.startswith("raised"), outcome
    assert waited < 3 + 30, waited  # the timeout, not for ever (a busy machine's margin)


def test_tp_size_that_splits_heads_is_refused():
    """Refused before anything is allocated or communicated, naming what would divide."""
    group = TPGroup(rank=0, size=2, group=object())  # never used: the check comes first
    qwen2 = ModelConfig.from_dir(resolve("tiny-qwen2"))  # 4 heads, 1 KV head
    # the sizes named are those that fail: the heads (4) divide by 2, the one KV head does not
    with pytest.raises(ValueError, match=r"tp_size=2 .*: num_kv_heads=1 \(.* values: \[1\]"):
        build_model(qwen2, SEQ_LEN, torch.device("cpu"), torch.float32, None, tp=group)
    llama = ModelConfig.from_dir(resolve("tiny-llama"))  # 4 heads, 2 KV heads, 192
    three = TPGroup(rank=0, size=3, group=object())
    with pytest.raises(ValueError, match=r"tp_size=3 .*num_heads=4, num_kv_heads=2 \(.*\[1, 2\]"):
        build_model(llama, SEQ_LEN, torch.device("cpu"), torch.float32, None, tp=three)
    mlp = ModelConfig.from_dict(
        {**QWEN2_BIAS, "intermediate_size": 90, "num_attention_heads": 8, "num_key_value_heads": 4}
    )  # heads divide by 4, 90 does not
    four = TPGroup(rank=0, size=4, group=object())
    with pytest.raises(ValueError, match=r"unevenly: intermediate_size=90 \(.*values: \[1, 2\]"):
        build_model(mlp, SEQ_LEN, torch.device("cpu"), torch.float32, None, tp=four)


def test_to_hf_state_dict_refuses_a_shard():
    group = TPGroup(rank=1, size=2, group=object())
    cfg = ModelConfig.from_dict(QWEN2_BIAS)
    with torch.device("meta"):  # shapes only: nothing to communicate, nothing to fill
        model = Decoder(cfg, SEQ_LEN, group)
    with pytest.raises(ValueError, match="tp_size=2"):
        to_hf_state_dict(model)
