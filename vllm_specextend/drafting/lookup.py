"""Draft, then look up (``lookup_tokens``): a request's own context proposes
the last drafts for free.

Why: on copy tasks (answers that quote or edit a long prompt) the draft
model accepts most of what it drafts, yet each drafted token costs a whole
draft forward: with the real Qwen2.5-Coder pair on an H100 a step's four
0.5B forwards took 4.6 ms of 8.6, the 1.5B target's 2.2 ms. Where the
context repeats, vLLM's prompt lookup (``ngram``) finds the next tokens with
no forward at all. So with K tokens asked for and ``m = lookup_tokens``, the
draft model drafts ``r = K - m`` tokens and the end of
``[verified context, bonus, d_1..d_r]`` is looked up in the verified
context: the ``m`` tokens after its longest earlier match (at least
``LOOKUP_KEY`` tokens; the latest of equals) are the step's last
proposals. The target verifies all K, so output stays exact; without draft
probabilities vLLM's rejection sampler treats them as
deterministic proposals, so sampling stays exact too (probabilistic draft
sampling is refused at config time).

``TokenHistory`` keeps each request slot's tokens on the device
(``[num_slots, width]`` int32, rows by ``state.slots_for``). Every draft step
writes its tokens at their positions (``record``), rejected drafts included:
those sit past the row's verified end, which no lookup reads past, and the
next step's tokens overwrite them. A slot handed to a new request is read
only up to that request's verified end, and its positions before that are
its own: written by its steps, or from the runner's host copy where its
first step starts past 0 (a prefix-cache hit, a resumed request:
``fill``). Everything is static shapes on the device, no host-device sync,
so ``look_up`` runs inside the captured draft routine (``draft_capture``).

Shapes: B rows of the step, N tokens, W = ``width``. Pure torch; no vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vllm_specextend.config.switches import env_count

LOOKUP_KEY = 3
"""The shortest match taken (n, by default): the last n tokens of the
sequence that ends with the step's drafts. vLLM's prompt lookup matches 1-5
tokens; 3 is long enough that code and prose rarely repeat it by chance,
short enough that an edited copy re-syncs within a few tokens."""

LOOKUP_LONGEST = 8
"""Match length counted (up to): a longer match wins over a later one, as in
vLLM's prompt lookup (longest of 1-5 there), so a common short phrase (an
indent, ``self.``) does not pull the proposals to its latest repeat when the
copied passage matches further back."""


def lookup_min_match() -> int:
    """``SPECEXTEND_LOOKUP_MIN_MATCH=N`` (1 to ``LOOKUP_LONGEST``): the
    shortest match the lookup takes (default ``LOOKUP_KEY``). An experiment
    on the real pair (``benchmarks/realpair``): where no 3-token match exists
    a row proposes its last draft again, which the target rejects, so a
    shorter match can only add accepted tokens; read from the workers'
    environment."""
    return env_count("SPECEXTEND_LOOKUP_MIN_MATCH", LOOKUP_KEY, 1, LOOKUP_LONGEST,
                     "tokens")


def bonus_positions(positions: torch.Tensor, query_start_loc: torch.Tensor,
                    num_rejected: torch.Tensor | None) -> torch.Tensor:
    """Each row's verified end: the position of its bonus token. [B] int64.

    vLLM 0.26's padded drafter batch (``prepare_inputs_padded``): row i's
    tokens are ``target_token_ids[qsl[i]:qsl[i+1]]`` at consecutive
    positions; a decode row holds ``[t_p, d_1..d_K]`` at ``p..p+K``, of which
    the last ``num_rejected[i] = K + 1 - valid_count`` were rejected, so its
    last verified token sits at index ``qsl[i+1] - 1 - num_rejected[i]``
    (vLLM's ``token_indices_to_sample``) and the bonus token
    (``next_token_ids[i]``) one position after it. A prompt chunk (no
    rejected counts: None) ends at ``qsl[i+1] - 1``.
    """
    last = query_start_loc[1:].to(torch.int64) - 1  # [B]
    if num_rejected is not None:
        last = last - num_rejected.to(torch.int64)
    return positions[last].to(torch.int64) + 1  # [B]


@dataclass
class LookupRows:
    """A step's rows for the lookup: their slots and verified ends, [B] each."""

    slots: torch.Tensor  # [B] int64
    bonus: torch.Tensor  # [B] int64

    def rows(self, start: int, stop: int) -> LookupRows:
        """Rows ``start:stop`` (a cut step's drafting part)."""
        return LookupRows(self.slots[start:stop], self.bonus[start:stop])


class TokenHistory:
    """Every request slot's tokens by position, on the device."""

    def __init__(self, num_slots: int, max_model_len: int, num_spec_tokens: int,
                 device: torch.device, min_match: int = LOOKUP_KEY):
        self.min_match = min_match  # the shortest match taken
        # Room for the bonus token at max_model_len and the drafts after it;
        # the last column takes whatever lies further (never read as context).
        self.width = max_model_len + num_spec_tokens + 2
        self.tokens = torch.zeros(num_slots, self.width, dtype=torch.int32,
                                  device=device)  # [num_slots, W]
        self._owner: list[str | None] = [None] * num_slots
        self._batch_slots = None  # the slots array fresh() last walked

    def fresh(self, req_ids: list[str], slots) -> list[int]:
        """Batch rows whose slot changed hands since it was last recorded
        (host only): their first positions may need ``fill``. ``slots``: the
        array ``SelectionState.slots_for`` returns, the same object while the
        rows hold the same requests in the same slots (a release makes it
        new, so requests resumed in each other's slots are walked)."""
        if slots is self._batch_slots:
            return []
        self._batch_slots = slots
        rows = []
        for row, (req_id, slot) in enumerate(zip(req_ids, slots.tolist(), strict=True)):
            if self._owner[slot] != req_id:
                self._owner[slot] = req_id
                rows.append(row)
        return rows

    def fill(self, slot: int, token_ids: torch.Tensor) -> None:
        """A request's first ``len(token_ids)`` tokens, known before its first
        recorded step (a prefix-cache hit, a resumed request). The runner's
        host copy holds -1 at output positions under async scheduling; the
        lookup never proposes those (``look_up``)."""
        self.tokens[slot, : token_ids.shape[0]] = token_ids.to(torch.int32)

    def record(self, slots: torch.Tensor, token_ids: torch.Tensor,
               positions: torch.Tensor, next_token_ids: torch.Tensor,
               query_start_loc: torch.Tensor,
               num_rejected: torch.Tensor | None) -> LookupRows:
        """Write a step's tokens and bonus tokens into their rows' history.

        ``slots`` [B] int64, ``token_ids`` [N], ``positions`` [N] (the
        runner's, one row), ``next_token_ids`` [B], ``query_start_loc`` [B+1]
        on the device, ``num_rejected`` [B] or None. Returns the rows' slots
        and verified ends for ``look_up``.
        """
        n, num_rows = token_ids.shape[0], slots.shape[0]
        last = self.width - 1
        # Row of each token: the query it falls in (num_rows: past the last). [N]
        token_rows = torch.searchsorted(
            query_start_loc[1:].to(torch.int64),
            torch.arange(n, device=token_ids.device), right=True)
        column = torch.where(token_rows < num_rows,
                             positions[:n].to(torch.int64).clamp(0, last), last)
        index = slots[token_rows.clamp(max=num_rows - 1)] * self.width + column
        flat = self.tokens.view(-1)
        flat.index_copy_(0, index, token_ids.to(torch.int32))
        bonus = bonus_positions(positions, query_start_loc, num_rejected)  # [B]
        flat.index_copy_(0, slots * self.width + bonus.clamp(max=last),
                         next_token_ids.to(torch.int32))
        return LookupRows(slots, bonus)

    def match(self, rows: LookupRows, drafts: torch.Tensor,
              num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's match for the sequence ``[..., bonus, d_1..d_r]``
        (``drafts`` [B, r], r >= 0): its end and length, [B] each (end -1:
        none; length counted up to ``LOOKUP_LONGEST``).

        An end j <= bonus - 1 (one verified token after it at least) matches
        where the history's tokens up to j equal the sequence's last ones, at
        least ``min_match`` of them (``LOOKUP_KEY`` by default). The match
        taken is the longest, then one whose ``num_tokens`` followers are all
        verified, then the latest."""
        n, top, w = self.min_match, LOOKUP_LONGEST, self.width
        history = self.tokens[rows.slots]  # [B, W]
        bonus = rows.bonus  # [B]
        # The sequence's last `top` tokens: its verified tail and the drafts;
        # positions before 0 hold -3, which no history token equals. [B, top]
        tail = bonus[:, None] + torch.arange(1 - top, 1, device=bonus.device)
        seq = torch.cat([torch.where(tail >= 0, history.gather(1, tail.clamp(0)), -3),
                         drafts.to(torch.int32)], dim=1)[:, -top:]
        # length[b, j]: how many of the sequence's last tokens end at j, up to
        # `top` (none reaches before position 0). [B, W]
        run = history == seq[:, -1:]
        length = run.to(torch.int32)
        for i in range(1, top):
            run[:, :i] = False
            run[:, i:] &= history[:, : w - i] == seq[:, -1 - i: -i]
            length += run
        ends = torch.arange(w, dtype=torch.int32, device=bonus.device)  # [W]
        usable = (length >= n) & (ends[None, :] <= bonus[:, None] - 1)
        full = ends[None, :] + num_tokens <= bonus[:, None]
        # Longest, then full, then latest, as one int32 rank per end (below
        # (2 * LOOKUP_LONGEST + 2) * W). [B, W]
        rank = torch.where(usable, (length * 2 + full) * w + ends[None, :], -1)
        best = rank.max(dim=1).values  # [B]
        found = best >= 0
        return torch.where(found, best % w, -1), torch.where(found, best // (2 * w), 0)

    def followers(self, rows: LookupRows, end: torch.Tensor,
                  num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``num_tokens`` tokens after each row's match ``end`` [B] and
        whether each is a proposal (verified, matched, no -1 a fill copied):
        [B, num_tokens] each."""
        follow = end[:, None] + torch.arange(1, num_tokens + 1, device=end.device)
        found = self.tokens[rows.slots[:, None],
                            follow.clamp(0, self.width - 1)]  # [B, num_tokens]
        valid = (end[:, None] >= 0) & (follow <= rows.bonus[:, None]) & (found >= 0)
        return found, valid

    def look_up(self, rows: LookupRows, drafts: torch.Tensor,
                num_tokens: int) -> torch.Tensor:
        """``num_tokens`` proposals per row after the drafts (``match``'s
        followers): [B, num_tokens]. Those past the verified end, and rows
        without a match, repeat d_r (the target rejects them)."""
        end, _ = self.match(rows, drafts, num_tokens)
        found, valid = self.followers(rows, end, num_tokens)
        filler = drafts[:, -1:].to(torch.int32)  # [B, 1]
        return torch.where(valid, found, filler).to(drafts.dtype)

    def extend(self, rows: LookupRows, drafts: torch.Tensor,
               num_tokens: int) -> torch.Tensor:
        """``drafts`` [B, r] and their lookup: [B, r + num_tokens]."""
        return torch.cat([drafts, self.look_up(rows, drafts, num_tokens)], dim=1)


def drafted(num_spec_tokens: int, lookup_tokens: int) -> int:
    """Tokens the draft model drafts of the K asked for: K - lookup_tokens,
    or K where that leaves none (a K the per-batch-size schedule lowered)."""
    if 0 < lookup_tokens < num_spec_tokens:
        return num_spec_tokens - lookup_tokens
    return num_spec_tokens
