"""An eager step's device inputs, read from the request table, and its prompt tokens."""

from __future__ import annotations

import numpy as np
import torch

from ..core import Batch
from ..device import to_device_many
from ..kvcache.table import TableManager


def fill_inputs(
    batch: Batch,
    table: TableManager,
    sampled: np.ndarray,
    prompt_ids: np.ndarray | None,
    extra_rows: np.ndarray | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fill `batch.positions`, `input_ids`, `out_loc` and `sample_idx` from its ledger and the
    host's page table; returns where the sampled tokens go in the token pool (rows, positions).
    `extra_rows`: token rows whose logits come after the sampled ones' (`prompt_logprob_rows`)."""
    rows, cached, device_len = batch.ledger
    extend = device_len - cached
    positions = ranges(cached, device_len)
    token_rows = np.repeat(rows, extend)
    out_loc = table.page_table_host[token_rows, positions]
    sample_idx = (np.cumsum(extend) - 1)[sampled]
    if extra_rows is not None:
        sample_idx = np.concatenate([sample_idx, extra_rows])
    arrays = [token_rows, positions, out_loc, sample_idx, rows[sampled], device_len[sampled]]
    if prompt_ids is not None:
        arrays.append(prompt_ids)
    sent = to_device_many(arrays, table.device)
    rows_t, positions_t, out_loc_t = sent[0], sent[1], sent[2]
    if prompt_ids is not None:
        first = batch.num_decode
        table.token_pool[rows_t[first:], positions_t[first:]] = sent[6].to(torch.int32)
    if not table.shares_host_memory:
        table.page_table[rows_t, positions_t] = out_loc_t.to(torch.int32)
    batch.positions = positions_t
    batch.input_ids = table.token_pool[rows_t, positions_t]
    batch.out_loc = out_loc_t
    batch.sample_idx = sent[3]
    return sent[4], sent[5]


def prompt_logprob_rows(batch: Batch) -> tuple[np.ndarray, np.ndarray] | None:
    """The token rows of a prompt step whose logits give prompt log probabilities (each
    position before its prompt's last, whose logits give the first output token, of the
    requests that ask), and how many each request has; None where none asks."""
    first = batch.num_decode
    if not batch.is_prefill or all(r.sampling.prompt_logprobs is None for r in batch.reqs[first:]):
        return None
    _, cached, device_len = batch.ledger
    prompt_len = np.array([r.prompt_len for r in batch.reqs], dtype=np.int64)
    asks = np.array([r.sampling.prompt_logprobs is not None for r in batch.reqs])
    asks[:first] = False
    counts = np.where(asks, np.clip(np.minimum(device_len, prompt_len - 1) - cached, 0, None), 0)
    if not counts.any():
        return None
    starts = np.cumsum(device_len - cached) - (device_len - cached)
    return ranges(starts, starts + counts), counts


def prompt_tokens(batch: Batch) -> np.ndarray:
    _, cached, device_len = batch.ledger
    first = batch.num_decode
    spans = zip(batch.reqs[first:], cached[first:].tolist(), device_len[first:].tolist())
    return np.concatenate([np.asarray(r.token_ids[a:b], dtype=np.int64) for r, a, b in spans])


def write_prompts(batch: Batch, table: TableManager, prompt_ids: np.ndarray) -> None:
    """The batch's prompt tokens to the token pool, where a padded graph step reads them."""
    rows, cached, device_len = batch.ledger
    first = batch.num_decode
    positions = ranges(cached[first:], device_len[first:])
    token_rows = np.repeat(rows[first:], device_len[first:] - cached[first:])
    rows_t, positions_t, ids = to_device_many([token_rows, positions, prompt_ids], table.device)
    table.token_pool[rows_t, positions_t] = ids.to(torch.int32)


def write_penalized_prefixes(batch: Batch, table: TableManager) -> None:
    """The tokens before a prompt step's first (a prefix taken from the cache, or computed
    before a retraction) to the token pool, for the requests whose penalties count their tokens
    there (`SamplingParams.penalized`): a step writes only the tokens it computes."""
    rows, cached, _ = batch.ledger
    first = batch.num_decode
    picks = [
        i for i in range(first, batch.size) if cached[i] > 0 and batch.reqs[i].sampling.penalized
    ]
    if not picks:
        return
    ends = cached[picks]
    ids = np.concatenate(
        [
            np.asarray(batch.reqs[i].token_ids[:c], dtype=np.int64)
            for i, c in zip(picks, ends.tolist())
        ]
    )
    positions = ranges(np.zeros(len(picks), dtype=np.int64), ends)
    token_rows = np.repeat(rows[picks], ends)
    rows_t, positions_t, ids_t = to_device_many([token_rows, positions, ids], table.device)
    table.token_pool[rows_t, positions_t] = ids_t.to(torch.int32)


def ranges(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """``concatenate([arange(a, b) for a, b in zip(starts, ends)])`` in whole-array steps."""
    lens = ends - starts
    before = np.cumsum(lens) - lens
    return np.arange(int(lens.sum()), dtype=np.int64) + np.repeat(starts - before, lens)
