"""Load, run, compare and benchmark, written as coroutines on qasync's loop.

Each awaits the model thread's futures (`specdeck.app.model_host.ModelHost`), so the GUI thread never runs
model code and never blocks, and records what happened in the `SessionModel`, which the views
follow. The coroutines take plain values (a `PairSpec`, a `DecodeConfig`, a prompt) and raise
`SpecDeckError`; `spawn` runs one and hands its error to a callback (the window's dialog).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine

from specdeck.app.model_host import ModelHost
from specdeck.app.session_model import SessionModel
from specdeck.app.worker import BenchCancelled, BenchOutcome, LoadCancelled, PairInfo, error_message
from specdeck.bench.prompts import BenchPrompt
from specdeck.bench.settings import BenchSettings
from specdeck.engine.config import DecodeConfig, check_prompt
from specdeck.engine.errors import SpecDeckError
from specdeck.engine.events import SummaryEvent
from specdeck.engine.export import RunInfo
from specdeck.engine.pair_spec import PairSpec


class SessionController:
    def __init__(self, host: ModelHost, model: SessionModel) -> None:
        self.host = host
        self.model = model
        host.events.connect(model.add_events)
        self._stop_requested = False
        self._tasks: set[asyncio.Task] = set()

    # loading ----------------------------------------------------------------------------------------

    async def load(self, spec: PairSpec) -> PairInfo:
        """Load the pair `spec` names; the model records it, or the failure and the field to blame."""
        self.model.set_activity(loading=True)
        try:
            info = await self.host.load(spec)
        except LoadCancelled:
            raise
        except SpecDeckError as error:
            self.model.set_load_failed(spec, str(error))
            raise
        finally:
            self.model.set_activity(loading=False)
        self.model.set_loaded(spec, info)
        return info

    async def ensure_loaded(self, spec: PairSpec) -> PairInfo:
        """Load `spec` unless it is the resident pair."""
        if self.model.needs_load(spec):
            return await self.load(spec)
        return self.model.pair

    def cancel_load(self) -> None:
        self.host.cancel_load()

    # sessions ---------------------------------------------------------------------------------------

    async def run(
        self,
        spec: PairSpec,
        prompt: str,
        config: DecodeConfig,
        chat: bool,
        compare: bool = False,
        versions: dict[str, str] | None = None,
    ) -> None:
        """One session (speculative with the pair's drafter), or a compare run: speculative, then
        plain, one after the other on the same device so neither timing disturbs the other."""
        self._stop_requested = False
        self.model.set_activity(running=True)
        try:
            prompt = check_prompt(prompt)
            pair = await self.ensure_loaded(spec)
            self.model.start_run(
                RunInfo(
                    pair.target,
                    pair.draft,
                    pair.drafter,
                    pair.device,
                    pair.dtype,
                    config,
                    chat,
                    prompt,
                    extra_versions=dict(versions or {}),
                    vocabulary=pair.vocabulary,
                    backend=pair.backend,
                ),
                compare,
            )
            speculative = await self._session(prompt, config, chat, plain=False)
            if compare and not self._stop_requested:
                await self._session(prompt, config, chat, plain=True)
            self.model.end_run()
            self.model.status.emit(" ".join(filter(None, (describe(speculative), self.model.prompt_notice))))
        finally:
            self.model.set_activity(running=False)

    async def _session(self, prompt: str, config: DecodeConfig, chat: bool, plain: bool) -> SummaryEvent:
        session_id, finished = self.host.run(prompt, config, chat=chat, plain=plain)
        self.model.start_session(session_id, plain)
        return await finished

    def stop(self) -> None:
        """Stop the session at the end of its round (and a compare run before its plain half)."""
        self._stop_requested = True
        self.host.stop()
        self.model.status.emit("Stopping at the end of this round…")

    # benchmark --------------------------------------------------------------------------------------

    async def benchmark(
        self,
        spec: PairSpec,
        prompts: list[BenchPrompt],
        settings: BenchSettings,
        source: str,
        command: str,
        drafters: tuple[PairSpec, ...],
    ) -> BenchOutcome | None:
        """The harness on the pair `spec` names (loaded first if needed), in the model thread; None
        when cancelled."""
        self.model.set_activity(benchmarking=True)
        try:
            await self.ensure_loaded(spec)
            self.model.status.emit(f"Benchmarking {len(prompts)} prompts…")
            try:
                outcome = await self.host.bench(prompts, settings, source, command, drafters)
            except BenchCancelled as cancelled:
                self.model.status.emit(str(cancelled))
                return None
            self.model.status.emit(
                "Benchmark done: "
                + ", ".join(
                    f"{r['method']}{' K=' + str(r['k']) if r['k'] else ''} {r['speedup_vs_plain']}x"
                    for r in outcome.summary
                    if r["category"] == "all" and r["method"] != "plain"
                )
            )
            return outcome
        finally:
            self.model.set_activity(benchmarking=False)

    def cancel_benchmark(self) -> None:
        self.host.cancel_bench()

    # running coroutines -----------------------------------------------------------------------------

    def spawn(self, coroutine: Coroutine, on_error: Callable[[str], None]) -> None:
        """Run `coroutine` on the loop; its error's message goes to `on_error`, a cancelled load to
        the status bar."""

        async def guarded() -> None:
            try:
                await coroutine
            except LoadCancelled:
                self.model.status.emit("Loading cancelled.")
            except asyncio.CancelledError:
                pass
            except Exception as error:
                on_error(error_message(error))

        task = asyncio.ensure_future(guarded())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @property
    def idle(self) -> bool:
        return not self._tasks

    def shutdown(self, wait_ms: int | None = None) -> bool:
        """Cancel every coroutine and end the model thread (the window closes), waiting for it at
        most `wait_ms`; whether it ended (`ModelHost.shutdown`)."""
        for task in list(self._tasks):
            task.cancel()
        return self.host.shutdown(wait_ms)


def describe(summary: SummaryEvent) -> str:
    """A session's figures in one line, for the status bar."""
    return (
        f"{summary.new_tokens} tokens in {summary.rounds} rounds ({summary.stop_reason}), "
        f"{summary.tokens_per_s:.1f} tokens/s, acceptance {summary.acceptance_rate:.2f}"
    )
