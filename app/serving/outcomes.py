"""What the generation service hands to and gets back from its routes: prompts in, outcomes out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from app.engine.sampling import SamplingParams
from app.serving.events import GenerationResult
from app.serving.policy import Decision, Policy
from app.serving.runtime import ServingArtifact
from app.serving.work_items import GenerationItem
from app.uncertainty.answer import ScoredAnswer


class ClientDisconnected(Exception):
    """The client went away; its work was cancelled."""


class ClientConnection(Protocol):
    """A request's connection, as far as the service watches it (FastAPI's `Request` is one)."""

    async def is_disconnected(self) -> bool: ...


@dataclass(frozen=True)
class PromptInput:
    """A raw prompt (sent as is) or chat messages (through the model's chat template): exactly one."""

    prompt: str | None = None
    messages: Sequence[Mapping[str, str]] | None = None

    @property
    def field(self) -> str:
        return "messages" if self.messages is not None else "prompt"

    @property
    def chars(self) -> int:
        """The characters of its text, the messages' contents together (what decides where it is tokenized)."""
        if self.messages is not None:
            return sum(len(str(m.get("content", ""))) for m in self.messages)
        return len(self.prompt or "")


@dataclass(frozen=True)
class PreparedGeneration:
    prompt_ids: list[int]
    params: SamplingParams
    policy: Policy
    seed: int | None
    serving: ServingArtifact  # read once: policy and scores come from the same artifact
    question: str  # the user's last turn (or the raw prompt): what a check pass asks about


@dataclass(frozen=True)
class Submitted:
    """A generation handed to the scheduler, with what deciding on its answer needs."""

    item: GenerationItem
    policy: Policy
    seed: int | None
    served: ServedModel  # who answered (named even if a reload swaps another artifact in meanwhile)
    question: str  # what a check pass asks about


@dataclass(frozen=True)
class ServedModel:
    """Who answered: what every response names."""

    model: str
    artifact: str | None
    manifest_sha256: str | None = None  # the manifest's hash: the decision log tells reloaded versions apart
    tad_available: bool = False  # an artifact with a regressor (a calibration-only one has none)


@dataclass(frozen=True)
class GenerationOutcome:
    result: GenerationResult
    decision: Decision
    seed: int | None
    text: str  # what the client may see: the answer, or the withheld message in its place
    served: ServedModel

    @property
    def withheld(self) -> bool:
        return self.decision.withheld

    @property
    def scored(self) -> ScoredAnswer:
        return self.result.scored

    @property
    def prompt_tokens(self) -> int:
        return len(self.result.sequence.request.prompt_ids)

    @property
    def completion_tokens(self) -> int:
        """Tokens the model generated, as vLLM's usage counts them: the stop token that ended the answer and
        those a stop string trimmed included, though neither is among the answer's tokens."""
        return self.result.sequence.tokens_chosen


@dataclass(frozen=True)
class ScoreOutcome:
    scored: ScoredAnswer
    decision: Decision
    prompt_tokens: int
    served: ServedModel
    serving: ServingArtifact  # the artifact that scored it (a reload may swap the one serving now)

    @property
    def completion_tokens(self) -> int:
        """The given response's tokens: nothing was generated."""
        return len(self.scored.trace)
