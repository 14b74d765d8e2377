"""Our model and tokenizer behind lm-evaluation-harness's model interface (lm_eval.api.model.TemplateLM, the base of
its own HFLM): loglikelihood, loglikelihood_rolling and generate_until, scored as HFLM scores them (the context and
continuation encoded by TemplateLM, the input cropped to the last model.max_seq_len tokens, log-softmax in float32).

Data parallel: lm_eval gives each data-parallel rank its share of every task's documents (rank = the strategy's
dp_rank, world_size = its dp_size; tensor-parallel peers share a dp_rank, so they see the same requests) and
gathers the per-document metrics with gather_object. Every rank runs the same number of forwards, whatever its
share holds (a dummy one-token forward where it has nothing left), because a sharded model's forward is a
collective (FSDP gathers its parameters, tensor parallelism splits every layer).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from lm_eval import utils
from lm_eval.api.model import TemplateLM

from train.distributed import all_reduce_max
from train.model.build import logits_of

# Batches are right-padded to a multiple of this (at most the model's context), so that few shapes are compiled and
# a sequence-parallel split of the positions is even; causal attention keeps the padding out of the real positions.
PAD_MULTIPLE = 64


class RunLM(TemplateLM):
    def __init__(self, model: torch.nn.Module, strategy: Any, device: torch.device, tokenizer: Any,
                 max_length: int, batch_size: int) -> None:
        super().__init__()
        self.model, self.strategy, self._device = model, strategy, device
        self.tokenizer_ = tokenizer
        self.max_length, self.batch_size = int(max_length), int(batch_size)
        self._rank, self._world_size = int(strategy.dp_rank), int(strategy.dp_size)

    # ------------------------------------------------------------------ lm_eval's interface
    @property
    def eot_token_id(self) -> int:
        return int(self.tokenizer_.eod_id)

    @property
    def device(self) -> torch.device:
        return self._device

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        return list(self.tokenizer_.encode(string))

    def tok_decode(self, tokens: Sequence[int]) -> str:
        return str(self.tokenizer_.decode(list(tokens)))

    def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        return super().loglikelihood(requests, disable_tqdm=True)  # no progress bar in the ranks' logs

    def _loglikelihood_tokens(self, requests: list[tuple[Any, list[int], list[int]]], disable_tqdm: bool = False,
                              **kwargs: Any) -> list[tuple[float, bool]]:
        """(sum of the continuation's log-probabilities, whether greedy decoding gives it) per request, in order."""
        rows = []
        for _, context, continuation in requests:
            inputs = (context + continuation)[-(self.max_length + 1):][:-1]
            rows.append((inputs, continuation[-min(len(continuation), len(inputs)):]))
        out: list[tuple[float, bool]] = [(0.0, False)] * len(rows)
        order = sorted(range(len(rows)), key=lambda i: -len(rows[i][0]))  # long ones first: similar lengths batched
        batches = [order[i:i + self.batch_size] for i in range(0, len(order), self.batch_size)]

        def score(batch: list[int], logits: torch.Tensor) -> None:
            for row, index in enumerate(batch):
                inputs, continuation = rows[index]
                n = len(continuation)
                logprobs = F.log_softmax(logits[row, len(inputs) - n:len(inputs)].float(), dim=-1)
                target = torch.tensor(continuation, device=logprobs.device)
                greedy = bool((logprobs.argmax(dim=-1) == target).all())
                out[index] = (float(logprobs.gather(1, target[:, None]).sum()), greedy)
                self.cache_hook.add_partial("loglikelihood", requests[index][0], out[index])

        self._in_lockstep([[rows[i][0] for i in batch] for batch in batches],
                          lambda k, logits: score(batches[k], logits))
        return out

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        """A document's log-likelihood over disjoint windows of the model's context, as HFLM computes it."""
        windows, owner = [], []
        for k, (string,) in enumerate(req.args for req in requests):
            for context, continuation in map(utils.make_disjoint_window, utils.get_rolling_token_windows(
                    token_list=self.tok_encode(string), prefix_token=self.prefix_token_id,
                    max_seq_len=self.max_length, context_len=1)):
                windows.append((None, context, continuation))
                owner.append(k)
        totals = [0.0] * len(requests)
        for k, (logprob, _) in zip(owner, self._loglikelihood_tokens(windows), strict=True):
            totals[k] += logprob
        for req, total in zip(requests, totals, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", (req.args[0],), total)
        return totals

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        """Greedy continuations, each ending before the first of its `until` strings (or the end-of-document id)."""
        results: list[str] = [""] * len(requests)
        batches = [list(range(i, min(i + self.batch_size, len(requests))))
                   for i in range(0, len(requests), self.batch_size)]
        done_batches = 0
        while all_reduce_max(len(batches) - done_batches, self._agree_device()) > 0:
            batch = batches[done_batches] if done_batches < len(batches) else []
            for index, text in zip(batch, self._generate([requests[i].args for i in batch]), strict=True):
                results[index] = text
                self.cache_hook.add_partial("generate_until", requests[index].args, text)
            done_batches += 1
        return results

    # ------------------------------------------------------------------ data parallel
    def _gather(self, obj: Any) -> list[Any]:
        """Every data-parallel rank's `obj`, by dp_rank (one rank of each tensor-parallel group speaks)."""
        if not (dist.is_initialized() and dist.get_world_size() > 1):
            return [obj]
        everyone: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, (self._rank, dist.get_rank(), obj))
        first: dict[int, tuple[int, Any]] = {}
        for dp_rank, rank, value in everyone:
            if dp_rank not in first or rank < first[dp_rank][0]:
                first[dp_rank] = (rank, value)
        return [first[r][1] for r in sorted(first)]

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        parts = [t.to(tensor.device) for t in self._gather(tensor.detach().cpu())]
        return torch.stack(parts) if tensor.dim() == 0 else torch.cat(parts)

    def gather_object(self, obj: Any, dst: int = 0) -> list[Any] | None:
        return self._gather(obj)

    def barrier(self) -> None:
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.barrier()

    # ------------------------------------------------------------------ forwards
    def _agree_device(self) -> torch.device:
        return self._device if dist.is_initialized() and dist.get_backend() != "gloo" else torch.device("cpu")

    def _forward(self, sequences: list[list[int]]) -> torch.Tensor:
        """Logits of right-padded sequences: [len(sequences), padded length, vocabulary]."""
        longest = max(len(s) for s in sequences)
        length = min(-(-longest // PAD_MULTIPLE) * PAD_MULTIPLE, max(self.max_length, longest))
        pad = self.eot_token_id
        batch = torch.tensor([s + [pad] * (length - len(s)) for s in sequences], dtype=torch.long,
                             device=self._device)
        with self.strategy.autocast():
            return logits_of(self.model(batch))

    def _in_lockstep(self, batches: list[list[list[int]]], use: Callable[[int, torch.Tensor], None]) -> None:
        """Forward each batch and hand its logits to `use`; a rank with fewer batches than another runs one-token
        forwards until every rank is done (a sharded model's forward is a collective)."""
        total = all_reduce_max(len(batches), self._agree_device())
        for k in range(total):
            if k < len(batches):
                use(k, self._forward(batches[k]))
            else:
                self._forward([[self.eot_token_id]])

    def _generate(self, args: list[tuple[str, dict[str, Any]]]) -> list[str]:
        """Greedy generation for one batch of (context, gen_kwargs); with none, one dummy forward per step until
        every rank's batch is done."""
        steps, untils, ids, texts = [], [], [], []
        for context, kwargs in args:
            kwargs = dict(kwargs or {})
            if kwargs.get("do_sample") or float(kwargs.get("temperature", 0.0) or 0.0) > 0:
                raise ValueError("harness generation is greedy: the task asks to sample (do_sample or temperature > "
                                 "0); set generation_kwargs do_sample: false in its YAML")
            until = kwargs.get("until") or []
            untils.append([until] if isinstance(until, str) else list(until))
            steps.append(int(kwargs.get("max_gen_toks", 256)))
            ids.append(self.tok_encode(context)[-max(self.max_length - steps[-1], 1):])
            texts.append("")
        active = list(range(len(args)))
        new: list[list[int]] = [[] for _ in args]
        while all_reduce_max(int(bool(active)), self._agree_device()):
            if not active:
                self._forward([[self.eot_token_id]])
                continue
            windows = [(ids[i] + new[i])[-self.max_length:] for i in active]
            logits = self._forward(windows)
            still = []
            for row, i in enumerate(active):
                token = int(logits[row, len(windows[row]) - 1].argmax())
                new[i].append(token)
                texts[i] = self.tok_decode(new[i])
                stop = token == self.eot_token_id or any(u in texts[i] for u in untils[i])
                if not stop and len(new[i]) < steps[i]:
                    still.append(i)
            active = still
        out = []
        for i, text in enumerate(texts):
            if new[i] and new[i][-1] == self.eot_token_id:
                text = self.tok_decode(new[i][:-1])
            for u in untils[i]:
                text = text.split(u)[0] if u else text
            out.append(text)
        return out
