"""Speculative decoding with the model's multi-token-prediction head (DeepSeek-V3's MTP):
each step drafts ``N`` tokens with the MTP module and verifies them in one forward of the
main model; docs/inference-model.md derives the step time and the tokens it yields.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from attrs import evolve, frozen

from zrt_core.errors import SpecError

if TYPE_CHECKING:
    from zrt_core.reports.inference import InferenceReport, PhaseBreakdown

#: Probability that a drafted token is accepted, by default: the DeepSeek-V3 technical
#: report (arXiv 2412.19437, section 5.4.3) measures 85-90% acceptance for the second token
#: its MTP module predicts; the low end.
DEFAULT_ACCEPTANCE = 0.85


@frozen
class MtpDecoding:
    """One speculative step: ``draft_s`` (the MTP module ``N`` times), ``verify_s`` (the
    main model over ``N + 1`` tokens a sequence) and the tokens each sequence keeps."""

    draft_tokens: int
    acceptance: float
    draft_s: float
    verify_s: float

    @property
    def step_s(self) -> float:
        return self.draft_s + self.verify_s

    @property
    def tokens_per_step(self) -> float:
        """Expected tokens a sequence emits per step: the verified token plus the accepted
        prefix of the drafts, ``1 + p + p² + … + p^N`` (draft ``i`` counts only if drafts
        ``1..i-1`` were accepted, each with probability ``p``)."""
        return sum(self.acceptance ** i for i in range(self.draft_tokens + 1))

    @property
    def tpot_s(self) -> float:
        return self.step_s / self.tokens_per_step


def mtp_step(base: PhaseBreakdown, wide: PhaseBreakdown, draft_tokens: int,
             acceptance: float, mtp_kind: str) -> MtpDecoding:
    """The speculative step from two decode breakdowns of the same layout and context:
    ``base`` at the batch ``B`` and ``wide`` at ``B·(N+1)`` sequences.

    Verify: the main model over ``N + 1`` query tokens a sequence costs what ``wide`` costs
    in every op but attention, whose time is the KV cache it reads, once per sequence
    (``base``'s attention). Draft: ``N`` sequential passes of one MTP module — one decoder
    block of ``mtp_kind`` plus the embedding and the shared head (``outside_layers``) — at
    ``B`` tokens."""
    attention_base = base.by_category_s.get("attention", 0.0)
    attention_wide = wide.by_category_s.get("attention", 0.0)
    verify_s = wide.time_s - attention_wide + attention_base
    block_s = base.per_layer_s.get(mtp_kind, 0.0)
    head_s = base.by_layer_kind_s.get("outside_layers", 0.0)
    return MtpDecoding(draft_tokens=draft_tokens, acceptance=acceptance,
                       draft_s=draft_tokens * (block_s + head_s), verify_s=verify_s)


def with_mtp(report: InferenceReport, wide: InferenceReport, draft_tokens: int,
             acceptance: float, config: Any) -> InferenceReport:
    """``report`` (a ``latency`` run at a fixed batch) with its TPOT and throughput under
    MTP speculative decoding; ``wide`` is the same run at ``batch·(N+1)``."""
    from zrt_core.checks import mtp_head_layers

    if not mtp_head_layers(config):
        raise SpecError("--mtp in serving drafts with the model's MTP head, and this config "
                        "declares none (num_nextn_predict_layers)",
                        "use a model with MTP layers (DeepSeek-V3) or drop --mtp")
    if report.decode is None or wide.decode is None:
        raise SpecError("--mtp needs the decode phase", "give --output-len > 1")
    kinds = [k for k in report.decode.per_layer_s if k != "outside_layers"]
    kind = "moe" if "moe" in kinds else (kinds[-1] if kinds else "")
    step = mtp_step(report.decode, wide.decode, draft_tokens, acceptance, kind)
    osl = int(report.workload.get("output_len", 1))
    total_s = report.ttft_s + max(osl - 1, 0) * step.tpot_s
    per_replica = report.batch * osl / total_s if total_s > 0 else 0.0
    dp = int(report.parallel.get("dp", 1))
    total = per_replica * dp
    throughput = {**report.throughput, "mtp_draft_tokens": draft_tokens,
                  "mtp_acceptance": acceptance, "mtp_tokens_per_step": step.tokens_per_step,
                  "mtp_draft_ms": step.draft_s * 1e3, "mtp_verify_ms": step.verify_s * 1e3,
                  "decode_step_ms": step.step_s * 1e3}
    note = (f"MTP speculative decoding: {draft_tokens} draft token(s) a step at acceptance "
            f"{acceptance:g}, {step.tokens_per_step:.3f} tokens per step; draft "
            f"{step.draft_s * 1e3:.3f} ms + verify {step.verify_s * 1e3:.3f} ms "
            f"(MTP weights not counted in memory)")
    return evolve(report, tpot_s=step.tpot_s, output_tokens_per_s=total,
                  output_tokens_per_s_per_gpu=total / max(report.num_gpus, 1),
                  requests_per_s=total / max(osl, 1), throughput=throughput,
                  notes=(*report.notes, note))
