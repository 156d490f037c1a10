"""Continuous batching for a Hugging Face causal LM: requests join and leave a running decode batch.

`ContinuousSampler` holds a `SlotCache` (slots.py) and the requests in its slots. The request batcher
(batcher.py) drives it in ticks:

    admit(requests)   each new request takes a free slot; the requests admitted together are prefilled in
                      one forward (identical prompts once, their KV copied to the other slots: a prompt's n
                      samples), a request whose trajectory left KV behind prefills only the new tokens
    tick()            every request in a slot draws its next token from the logits it holds; the finished
                      ones leave (their KV is parked for their trajectory's next turn), the others are fed
                      their token in one decode forward over the slots

A decode step reads every weight once whatever the row count, so free slots cost little; they are
compacted away once they are a quarter of the slots (copying the cache), as the old sampler dropped
finished rows. Draws use each request's own counter-based stream at its own position
(`random_streams`), so a request's tokens do not depend on when it was admitted or what it shares a
batch with (up to the last bits of the batched arithmetic, which the batcher's admission order fixes).

With a KV budget (`kv_budget_columns`, engines/kv_budget.py) the slot cache holds at most that many token
columns (slots x capacity). `admit` queues the requests and takes them in their order while the cache they
would need fits; the rest wait and join as rows finish (at the end of a step). Whether a request fits depends
only on token counts (prompt lengths, max_new_tokens, tokens sampled so far), never on the clock, so a run
under a small budget samples exactly what it would in one batch, a few rows at a time.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from grpoflow.errors import UserError
from grpoflow.models.exact import BatchInvariantOps
from grpoflow.models.loading import cache_keyword
from grpoflow.models.nucleus import NO_CUT
from grpoflow.engines.decode_state import SlotState
from grpoflow.engines.protocol import Completion, Request
from grpoflow.engines.random_streams import uniforms
from grpoflow.engines.sampling import sample_tokens
from grpoflow.engines.slots import SlotCache, attention_mask, supports

# Free slots are compacted away once they are at least 1 / COMPACT_FRACTION of the slots: a decode step's
# matrix products read every weight once whatever the row count, so a few idle rows cost little, while
# compacting copies every layer's cache (the old sampler's DROP_FRACTION, measured in bench/ablation.py).
COMPACT_FRACTION = 4


@dataclass
class Row:
    """A request in a slot: the ids whose KV the slot holds, and what it sampled so far."""
    rid: int
    request: Request
    fed: list[int]
    prefilled: int
    reused: int = 0  # prompt tokens whose KV came from the trajectory's parked earlier turn
    ids: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    floors: list[float] = field(default_factory=list)  # each token's nucleus floor (models/nucleus.py)


def cut(floors: list[float]) -> list[float]:
    """A completion's nucleus floors where top-p cut something at one of its tokens, else [] (top_p = 1: nothing
    to carry, the trainer scores under the full distribution)."""
    return floors if any(f > NO_CUT for f in floors) else []


class ParkedKV:
    """The KV caches that finished requests left for their trajectories' next turns, within `max_bytes`
    (least recently parked evicted first; an evicted trajectory's next turn prefills from scratch)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes, self.used = max_bytes, 0
        self.entries: OrderedDict[int, tuple[list[int], list[tuple[Tensor, Tensor]], int]] = OrderedDict()

    def put(self, key: int, ids: list[int], kv: list[tuple[Tensor, Tensor]]) -> int:
        """Park trajectory `key`'s KV; how many other parked caches it evicted (logged as rollout/kv_evicted)."""
        self.drop(key)
        size = sum(k.numel() * k.element_size() * 2 for k, _ in kv)
        if size > self.max_bytes:
            return 0
        self.entries[key] = (ids, kv, size)
        self.used += size
        evicted = 0
        while self.used > self.max_bytes:
            _, (_, _, freed) = self.entries.popitem(last=False)
            self.used -= freed
            evicted += 1
        return evicted

    def take(self, key: int | None, prompt: tuple[int, ...]) -> tuple[int, list[tuple[Tensor, Tensor]] | None]:
        """(columns reused, their KV) for a request of trajectory `key` with `prompt`: the parked ids' longest
        common prefix with the prompt, less one token when it is the whole prompt (its logits are needed)."""
        if key is None or key not in self.entries:
            return 0, None
        ids, kv, size = self.entries.pop(key)
        self.used -= size
        common = 0
        for a, b in zip(ids, prompt):
            if a != b:
                break
            common += 1
        reuse = min(common, len(prompt) - 1)
        if reuse <= 0:
            return 0, None
        return reuse, [(k[:, :reuse], v[:, :reuse]) for k, v in kv]

    def drop(self, key: int) -> None:
        if key in self.entries:
            self.used -= self.entries.pop(key)[2]

    def clear(self) -> None:
        self.entries.clear()
        self.used = 0


class ContinuousSampler:
    """Slots of a `SlotCache` over `model`; `admit` and `tick` as the module docstring says."""

    def __init__(self, model: torch.nn.Module, *, pad_token_id: int, kv_reuse_bytes: int = 1 << 30,
                 compact_fraction: int = COMPACT_FRACTION, kv_budget_columns: int | None = None,
                 exact: bool = False) -> None:
        """`compact_fraction`: free slots are compacted away once they are 1 / compact_fraction of the slots.
        `kv_budget_columns`: the most token columns (slots x capacity) the slot cache may hold; None: no limit.
        `exact` (rollout.exact): forwards under `BatchInvariantOps` (models/exact.py)."""
        if not supports(model.config):
            raise UserError(f"the HF rollout engine's continuous batching serves full-attention models only; "
                            f"{type(model).__name__} has sliding-window or other attention layers. Use "
                            "rollout.engine=vllm or sglang for it.")
        self.model, self.pad_token_id, self.compact_fraction = model, pad_token_id, compact_fraction
        self.exact = exact
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.cache_kw = cache_keyword(model)
        self.config: Any = getattr(model, "config")  # noqa: B009 (read as Any: nn.Module types .config as Tensor | Module)
        self.cache = SlotCache(self.config.num_hidden_layers, 0, 64)
        self.rows: list[Row | None] = []
        self.logits: Tensor | None = None  # [slots, V] each live row's next-token logits
        self.state = SlotState.empty(0, self.device)  # what a decode step needs of each slot, on the device
        self.kinds: dict[tuple[float, float], int] = {}  # (temperature, top_p) -> the kind id SlotState holds
        self.budget = kv_budget_columns
        self.queue: list[tuple[int, Request]] = []  # admitted requests waiting for room in the cache, in order
        self.peak_columns = 0              # the most token columns the cache held (slots x capacity)
        self.parked = ParkedKV(kv_reuse_bytes)
        self.prefilled_tokens = 0          # prompt tokens computed (not reused, not shared)

    @property
    def busy(self) -> bool:
        return bool(self.queue) or any(r is not None for r in self.rows)

    # ------------------------------------------------------------ admit

    def admit(self, requests: list[tuple[int, Request]]) -> None:
        """Queue each (request id, request) and take in the ones the KV budget has room for (all without one)."""
        if self.budget is not None:
            for _, q in requests:
                if len(q.prompt_ids) + q.max_new_tokens + 2 > self.budget:
                    raise UserError(f"a request of {len(q.prompt_ids)} prompt + {q.max_new_tokens} new tokens needs "
                                    f"{len(q.prompt_ids) + q.max_new_tokens + 2} KV columns and the HF engine's KV "
                                    f"budget holds {self.budget}: raise rollout.kv_cache_mb or shorten it.")
        self.queue += requests
        self._admit_queued()

    def _admit_queued(self) -> None:
        """Admit queued requests in order while they fit the budget (module docstring)."""
        if not self.queue:
            return
        take = self.queue if self.budget is None else self._fitting()
        if not take and any(r is None for r in self.rows):  # free slots hold room: drop them, then try again
            self._compact([s for s, r in enumerate(self.rows) if r is not None])
            take = self._fitting()
        self.queue = self.queue[len(take):]
        self._admit_now(take)

    def _fitting(self) -> list[tuple[int, Request]]:
        """The longest head of the queue that fits the budget next to the live rows."""
        assert self.budget is not None
        live = [r for r in self.rows if r is not None]
        if not live and self.rows:  # an empty cache starts over at the size the next requests need
            self.release()
        longest = max([0] + [len(r.fed) + r.request.max_new_tokens - len(r.ids) for r in live])
        take: list[tuple[int, Request]] = []
        for rid, q in self.queue:
            longest = max(longest, len(q.prompt_ids) + q.max_new_tokens)
            slots = max(len(self.rows), len(live) + len(take) + 1)
            if slots * max(self.cache.capacity, longest + 2) > self.budget:
                break
            take.append((rid, q))
        return take

    @torch.no_grad()
    def _admit_now(self, requests: list[tuple[int, Request]]) -> None:
        """Put each (request id, request) in a free slot and compute its first logits."""
        if not requests:
            return
        free = [s for s, r in enumerate(self.rows) if r is None]
        need = len(requests) - len(free)
        longest = max(len(q.prompt_ids) + q.max_new_tokens for _, q in requests)
        longest = max([longest] + [len(r.fed) + r.request.max_new_tokens - len(r.ids) for r in self.rows if r])
        self._grow(len(self.rows) + max(need, 0), longest + 2)
        free = [s for s, r in enumerate(self.rows) if r is None]
        first: dict[tuple[int, ...], int] = {}  # prompt -> the slot that prefills it (requests with no reused KV)
        prefill: list[tuple[int, int, list[int]]] = []  # (slot, reused columns, suffix)
        copies: list[tuple[int, int]] = []             # (source slot, destination slot)
        for (rid, q), slot in zip(requests, free):
            reuse, kv = self.parked.take(q.key, q.prompt_ids)
            shared = first.get(q.prompt_ids) if kv is None else None
            if shared is not None:
                copies.append((shared, slot))
                self.rows[slot] = Row(rid, q, list(q.prompt_ids), prefilled=0)
                continue
            if kv is None:
                first[q.prompt_ids] = slot
            else:
                self.cache.load(slot, kv)
            prefill.append((slot, reuse, list(q.prompt_ids[reuse:])))
            self.rows[slot] = Row(rid, q, list(q.prompt_ids), prefilled=len(q.prompt_ids) - reuse, reused=reuse)
        self._prefill(prefill)
        slots = free[:len(requests)]
        rows = [row for row in (self.rows[slot] for slot in slots) if row is not None]
        self.state.set(slots, [r.request for r in rows], [len(r.fed) for r in rows],
                       [self.kinds.setdefault((r.request.temperature, r.request.top_p), len(self.kinds)) for r in rows])
        if copies:
            src = torch.tensor([s for s, _ in copies], device=self.device)
            dst = torch.tensor([d for _, d in copies], device=self.device)
            self.cache.copy(src, dst, max(len(self.rows[d].fed) for _, d in copies))  # type: ignore[union-attr]
            assert self.logits is not None
            self.logits[dst] = self.logits[src]

    def _prefill(self, prefill: list[tuple[int, int, list[int]]]) -> None:
        """One forward over the suffixes, left-padded so every row's last token is the last query."""
        if not prefill:
            return
        queries = max(len(suffix) for _, _, suffix in prefill)
        tokens = torch.full((len(prefill), queries), self.pad_token_id, dtype=torch.long)
        pad = torch.ones((len(prefill), queries), dtype=torch.bool)
        for a, (_, _, suffix) in enumerate(prefill):
            tokens[a, queries - len(suffix):] = torch.tensor(suffix, dtype=torch.long)
            pad[a, queries - len(suffix):] = False
            self.prefilled_tokens += len(suffix)
        rows = torch.tensor([slot for slot, _, _ in prefill], device=self.device)
        starts = torch.tensor([reuse - (queries - len(suffix)) for _, reuse, suffix in prefill], device=self.device)
        width = max(reuse + len(suffix) for _, reuse, suffix in prefill)
        logits = self._forward(rows, starts, starts, tokens.to(self.device), pad.to(self.device), width,
                               last_only=True)
        assert self.logits is not None
        self.logits[rows] = logits

    # ------------------------------------------------------------ step

    @torch.no_grad()
    def tick(self, version: int) -> list[tuple[int, Completion]]:
        """Every live request draws a token; returns the (request id, completion) of those that finished."""
        live = [s for s, r in enumerate(self.rows) if r is not None]
        if not live:
            self._admit_queued()
            return []
        tokens, log_probs, floors = self._draw()
        finished: list[tuple[int, Completion]] = []
        going: list[int] = []
        for slot in live:
            token, log_prob, floor = tokens[slot], log_probs[slot], floors[slot]
            row = self.rows[slot]
            assert row is not None
            row.ids.append(token)
            row.log_probs.append(log_prob)
            row.versions.append(version)
            row.floors.append(floor)
            q = row.request
            if token in q.stop_token_ids or len(row.ids) >= q.max_new_tokens:
                finish = "stop" if token in q.stop_token_ids else "length"
                evicted = 0 if q.key is None else self.parked.put(q.key, row.fed + row.ids[:-1],
                                                                  self.cache.save(slot, len(row.fed)))
                finished.append((row.rid, Completion(row.ids, row.log_probs, row.versions, finish, row.prefilled,
                                                     row.reused, evicted, cut(row.floors))))
                self.rows[slot] = None
            else:
                going.append(slot)
        if going:
            self._decode(going)
        self._admit_queued()  # after the decode, which rewrites every slot's logits
        return finished

    def pause(self) -> list[tuple[int, Completion]]:
        """Stop every request in a slot at the token boundary it is at: (request id, what it sampled so far, finish
        "paused"); the slots are freed and nothing is parked (a paused request goes on later with new weights,
        re-prefilling its prompt and these tokens)."""
        paused = [(rid, Completion([], [], [], "paused", 0)) for rid, _ in self.queue]
        self.queue = []
        self.state.live.fill_(False)
        for slot, row in enumerate(self.rows):
            if row is not None:
                paused.append((row.rid, Completion(row.ids, row.log_probs, row.versions, "paused", row.prefilled,
                                                   row.reused, floors=cut(row.floors))))
                self.rows[slot] = None
        return paused

    def _draw(self) -> tuple[list[int], list[float], list[float]]:
        """Every slot draws its next token from its logits and its stream (a free slot's draw is ignored): the
        ids, log-probs and nucleus floors (models/nucleus.py) of all slots, brought to the host in one copy, the
        decode step's only one.

        Drawing over every slot rather than the live ones keeps the step free of host-built index tensors; a free
        slot costs one row of sampling (free slots are under 1 / compact_fraction of the slots). Rows of several
        (temperature, top_p) kinds are drawn once per kind and each takes its own kind's draw; every operation of
        `sample_tokens` is row by row, so a row draws what it would with its kind alone."""
        assert self.logits is not None
        st, logits = self.state, self.logits
        kinds = sorted({(r.request.temperature, r.request.top_p) for r in self.rows if r is not None})
        uniform = uniforms(st.stream, st.position)
        token, log_prob, floor = sample_tokens(logits, temperature=kinds[0][0], top_p=kinds[0][1], uniform=uniform)
        for temperature, top_p in kinds[1:]:
            t, lp, fl = sample_tokens(logits, temperature=temperature, top_p=top_p, uniform=uniform)
            mine = st.kind == self.kinds[(temperature, top_p)]
            token, log_prob, floor = torch.where(mine, t, token), torch.where(mine, lp, log_prob), \
                torch.where(mine, fl, floor)
        st.advance(token)
        # float64 holds every id and every float32 log-prob and floor exactly: one tensor, one copy
        host = torch.cat([token.double(), log_prob.double(), floor.double()]).tolist()
        slots = len(self.rows)
        return [int(t) for t in host[:slots]], host[slots:2 * slots], host[2 * slots:]

    def _decode(self, going: list[int]) -> None:
        """Feed each continuing row its last token (one forward over every slot; free slots write the dump).
        Tokens, columns, positions and the mask come from the device's `SlotState`: nothing is built on the host."""
        free = len(self.rows) - len(going)
        if free and free * self.compact_fraction >= len(self.rows):
            self._compact(going)
            going = list(range(len(going)))
        width = 1 + max(len(self.rows[s].fed) for s in going)  # type: ignore[union-attr]
        st = self.state
        columns = torch.where(st.live, st.column, self.cache.dump)  # free slots write the dump column
        reads = torch.where(st.live, st.column, 0)                   # and read column 0 only
        logits = self._forward(None, columns, reads, st.token[:, None], None, width, last_only=False)
        assert self.logits is not None
        self.logits[:] = logits
        st.fed()
        for slot in going:
            row = self.rows[slot]
            assert row is not None
            row.fed.append(row.ids[-1])

    # ------------------------------------------------------------ the model and the cache

    def _forward(self, rows: Tensor | None, columns: Tensor, reads: Tensor, tokens: Tensor, pad: Tensor | None,
                 width: int, *, last_only: bool) -> Tensor:
        """[A, V] float32 logits of each row's last query; `rows` None: every slot. All tensors on the device:
        `columns` [A] where each row's first query writes its KV (the dump for a free slot), `reads` [A] the
        column of its first query for the mask and positions (negative where the first queries are padding; 0
        for a free slot), `tokens` [A, Q], `pad` [A, Q] or None; `width` the columns attention reads."""
        queries = tokens.shape[1]
        visible = attention_mask(reads, queries, width, pad)
        mask = torch.zeros(visible.shape, dtype=self.dtype, device=self.device).masked_fill(
            ~visible, torch.finfo(self.dtype).min)
        positions = (reads[:, None] + torch.arange(queries, device=self.device)[None, :]).clamp(min=0)
        self.cache.prepare(rows, columns, queries, pad, width)
        # an index, not the int 1: the head then reads a contiguous [A, 1, hidden] copy, as it always has (a strided
        # slice takes another GEMM path, whose last bits differ on a 49k vocabulary); only prefills pass it
        keep = {"logits_to_keep": torch.tensor([queries - 1], device=self.device)} if last_only else {}
        with BatchInvariantOps() if self.exact else contextlib.nullcontext():
            out = self.model(input_ids=tokens, attention_mask=mask, position_ids=positions, use_cache=True,
                             **{self.cache_kw: self.cache}, **keep)
        return out.logits[:, -1].float()

    def _grow(self, slots: int, capacity: int) -> None:
        """Room for `slots` requests of up to `capacity - 1` columns (plus the dump)."""
        if capacity > self.cache.capacity:
            doubled = 2 * self.cache.capacity
            capacity = max(capacity, doubled if self.budget is None else min(doubled, self.budget // max(slots, 1)))
        self.cache.grow(slots, capacity)
        self.state.grow(slots)
        self.peak_columns = max(self.peak_columns, self.cache.slots * self.cache.capacity)
        if len(self.rows) < slots:
            self.rows += [None] * (slots - len(self.rows))
        vocab = self.config.vocab_size
        if self.logits is None or self.logits.shape[0] < slots:
            grown = torch.zeros(slots, vocab, device=self.device)
            if self.logits is not None:
                grown[:self.logits.shape[0]] = self.logits
            self.logits = grown

    def _compact(self, going: list[int]) -> None:
        keep = torch.tensor(going, device=self.device)
        self.cache.keep(keep)
        self.state.keep(keep)
        assert self.logits is not None
        self.logits = self.logits[keep]
        self.rows = [self.rows[s] for s in going]

    def clear(self) -> None:
        """Forget the parked KV (a rollout is over, or the weights changed)."""
        self.parked.clear()

    def release(self) -> None:
        """Free the slot cache and the logits (rebuilt at the next admit): between rollouts, or when empty."""
        if any(r is not None for r in self.rows):
            raise RuntimeError("the HF engine's KV cache was released while requests were running")
        self.cache = SlotCache(self.config.num_hidden_layers, 0, 64)
        self.rows, self.logits = [], None
        self.state = SlotState.empty(0, self.device)
