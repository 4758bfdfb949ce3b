"""`dflash-gguf serve` (OpenAI-compatible server) and `dflash-gguf models` (what LM Studio/Jan/HF hold)."""

from __future__ import annotations

import ipaddress
import json
import sys
from pathlib import Path
from typing import Optional

import typer

from ..engine_options import chat_template_option, learn_max_mb_option, learn_option, with_engine_options
from ..errors import RunFailure, SetupError, UserError


def register(app: typer.Typer) -> None:
    @app.command(context_settings={"help_option_names": ["-h", "--help"]})
    @with_engine_options
    def serve(
        model: Optional[str] = typer.Option(None, "-m", "--model",
                                            help="target GGUF, or a name from `dflash-gguf models` "
                                                 "(lmstudio:<publisher>/<model>, jan:<id>, hf:<repo>/<file>)"),
        draft: Optional[str] = typer.Option(None, "-md", "--model-draft",
                                            help="DFlash drafter GGUF (default: one found that fits the target)"),
        host: str = typer.Option("127.0.0.1", "--host", help="address to bind; loopback unless you share it"),
        port: int = typer.Option(8080, "--port"),
        api_key: Optional[str] = typer.Option(None, "--api-key", envvar="DFLASH_GGUF_API_KEY",
                                              help="require `Authorization: Bearer KEY` on /v1/*"),
        alias: Optional[str] = typer.Option(None, "--alias", help="model id reported by /v1/models"),
        cors_origin: list[str] = typer.Option(["*"], "--cors-origin", help="allowed browser origin (repeatable)"),
        chat_template: Optional[str] = chat_template_option(),
        max_tokens: Optional[int] = typer.Option(None, "--max-tokens",
                                                 help="default max_tokens when a request sets none "
                                                      "(default: until the context is full)"),
        plain: bool = typer.Option(False, "--plain", help="serve without speculation (baseline)"),
        cache_prompt: bool = typer.Option(True, "--cache-prompt/--no-cache-prompt",
                                          help="reuse the longest common prefix of the last conversation "
                                               "(llama-server's cache_prompt; a request can still send false)"),
        cache_ram: int = typer.Option(2048, "-cram", "--cache-ram",
                                      help="MiB of RAM for other conversations' caches (least recently used "
                                           "out first; -1: no limit, 0: keep only the current one)"),
        slot_save_path: Optional[Path] = typer.Option(None, "--slot-save-path",
                                                      help="folder for POST /slots/0?action=save|restore files"),
        learn: Optional[Path] = learn_option(),
        learn_max_mb: float = learn_max_mb_option(),
        engine_options: dict = None,
    ):
        """OpenAI-compatible server (chat, completions, models, health) for Jan, LM Studio and any client."""
        try:
            import uvicorn
        except ImportError:
            raise SetupError("serve needs the server extra: pip install 'dflash-gguf[server]'") from None

        from ..engine.session import Engine, check_inputs
        from ..engine.sources.corpus import DEFAULT_MAX_TOKENS, Corpus
        from ..learn.store import recorder_for
        from ..settings import EngineSettings
        from .app import ServerConfig, create_app
        from .prompt_cache import CacheSettings
        from .worker import EngineWorker

        target, drafter = _pick_models(model, draft, plain)
        from ..textgen.chat import read_choice
        choice = read_choice(chat_template)
        template = choice.text if choice else None
        settings = EngineSettings.from_env(target=target, drafter=drafter, **engine_options)
        if max_tokens is not None and max_tokens < 1:
            raise UserError(f"--max-tokens {max_tokens}: must be >= 1")
        if not 0 < port < 65536:
            raise UserError(f"--port {port}: must be in 1..65535")
        inputs = check_inputs(settings, speculative=not plain)      # refuse bad files before listening
        log = lambda msg: print(f"dflash-gguf serve: {msg}", file=sys.stderr, flush=True)  # noqa: E731
        if cache_ram < -1:
            raise UserError(f"--cache-ram {cache_ram}: must be >= 0 MiB, or -1 for no limit")
        cache = CacheSettings(cache_prompt, None if cache_ram == -1 else cache_ram << 20, slot_save_path)
        recorder = recorder_for(learn, learn_max_mb, inputs.target)
        corpus = Corpus(recorder.recent_answers(DEFAULT_MAX_TOKENS)) if recorder is not None else None
        worker = EngineWorker(lambda: _load_engine(Engine, inputs, inputs.target, plain, corpus), log=log,
                              cache=cache, recorder=recorder, corpus=corpus)
        model_id = alias or (target.stem if target else "smollm2-135m-instruct-dflash")
        app = create_app(worker, ServerConfig(model_id, api_key, tuple(cors_origin), max_tokens, template))
        _announce(host, port, api_key, log)
        if recorder is not None:
            log(recorder.announce())
            log(f"lookup drafts from {len(corpus)} recorded answers ({corpus.n_tokens} tokens) and each new one")
        log(f"loading {target or 'the embedded default model'} in the background; /health answers 503 until "
            "it is ready")
        worker.start()
        try:
            uvicorn.run(app, host=host, port=port, log_level="warning")
        finally:
            worker.stop(timeout=10)

    @app.command()
    def models(as_json: bool = typer.Option(False, "--json", help="one JSON list instead of text")):
        """List GGUF targets in LM Studio's, Jan's and the Hugging Face folders, with the drafters that fit."""
        from .discovery import hf_roots, jan_data_folders, lmstudio_roots, scan
        found = scan()
        if as_json:
            typer.echo(json.dumps([{**f.__dict__, "path": str(f.path), "drafters": [str(d) for d in f.drafters]}
                                   for f in found], indent=2))
            return
        if not found:
            places = [*lmstudio_roots(), *(d / "llamacpp" / "models" for d in jan_data_folders()), *hf_roots()]
            typer.echo("no GGUF files found in:\n" + "\n".join(f"  {p}" for p in places))
            return
        for f in found:
            if f.is_drafter:
                typer.echo(f"{f.name}  (DFlash drafter, {f.n_embd} wide)  {f.path}")
                continue
            kind = f.architecture if f.architecture == "unreadable" else \
                f"{f.architecture}, {f.n_layer} layers, {f.n_embd} wide, vocab {f.n_vocab}"
            typer.echo(f"{f.name}  ({kind})  {f.path}")
            for d in f.drafters:
                typer.echo(f"    fits drafter: {d}")
            if not f.drafters and f.architecture != "unreadable":
                typer.echo("    no drafter found for it (train one: dflash-gguf train)")


def _load_engine(engine_class, settings, target: Path, plain: bool, corpus=None):
    """The engine, or an error naming the model file (shown by /health, every request and the log); settings:
    EngineSettings, or the EngineInputs check_inputs returned; corpus: the recorded answers (--learn)."""
    try:
        return engine_class(settings, speculative=not plain, corpus=corpus)
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 - whatever failed, the person needs to know which file
        raise RunFailure(f"{target}: {type(e).__name__}: {e}") from e


def _pick_models(model: str | None, draft: str | None, plain: bool) -> tuple[Path | None, Path | None]:
    """Resolve -m/-md names; without -md, take a found drafter that fits (or the shipped one)."""
    from ..assets import shipped_drafter_for
    from ..engine.session import default_target
    from .discovery import drafters_for, resolve_model
    target = resolve_model(model) if model else None
    if target is not None and not target.is_file():
        raise UserError(f"-m {model}: {target} is not a file")
    drafter = resolve_model(draft, drafter=True) if draft else None
    if plain or drafter is not None:
        return target, drafter
    served = target or default_target()
    if shipped_drafter_for(served) is not None:
        return target, None                      # the engine picks the shipped one
    fitting = drafters_for(served)
    if not fitting:
        raise UserError(f"no drafter found for {served.name}: pass one with -md DRAFT.gguf, train one "
                        "(dflash-gguf train), or serve without speculation (--plain)")
    print(f"dflash-gguf serve: drafter {fitting[0]} (fits {served.name}; -md to choose another)", file=sys.stderr)
    return target, fitting[0]


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _announce(host: str, port: int, api_key: str | None, log) -> None:
    url = f"http://{host}:{port}/v1"
    if _loopback(host):
        log(f"listening on {url} (loopback only: other machines cannot connect; --host 0.0.0.0 to share)")
    elif api_key:
        log(f"listening on {url}: reachable from other machines; requests need the API key")
    else:
        log("!" * 78)
        log(f"WARNING: listening on {url}, reachable from OTHER MACHINES, WITHOUT an API key.")
        log("Anyone on the network can use this server. Add --api-key KEY, or bind 127.0.0.1.")
        log("!" * 78)
