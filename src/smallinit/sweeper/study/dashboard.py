"""optuna-dashboard on a sweep's study: `python -m smallinit.sweeper.study.dashboard [SWEEP_DIR | --storage URL]`.

The study is wherever the sweep kept it: the sweep folder's optuna.db by default, or the
URL given as hydra.sweeper.storage (PostgreSQL for teams). A plain postgresql:// URL is
opened with the driver the postgres extra installed, as the sweep itself does.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from smallinit.core.errors import ConfigError

from .study import default_storage_url, open_storage, redacted, storage_url


def newest_sweep_dir(root: Path = Path("sweeps")) -> Path | None:
    found = [p.parent for p in Path(root).glob("*/optuna.db")]
    return max(found, key=lambda p: (p / "optuna.db").stat().st_mtime) if found else None


def resolve(sweep: str | None, storage: str | None) -> str:
    """The storage URL to serve: --storage wins, else SWEEP_DIR's (or the newest sweep's) optuna.db."""
    if storage:
        return storage_url(storage)
    folder = Path(sweep) if sweep else newest_sweep_dir()
    if folder is None:
        raise ConfigError("no sweep folder with an optuna.db under sweeps/: give SWEEP_DIR or --storage URL")
    if not (folder / "optuna.db").is_file():
        raise ConfigError(f"{folder}/optuna.db does not exist: is {folder} a sweep folder? "
                          "(a sweep with hydra.sweeper.storage=URL keeps its study there: pass --storage URL)")
    return default_storage_url(folder)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m smallinit.sweeper.study.dashboard", description=__doc__.split("\n")[0])
    p.add_argument("sweep", nargs="?", help="sweep folder (default: the newest under sweeps/)")
    p.add_argument("--storage", help="the study's storage URL, as given to hydra.sweeper.storage")
    p.add_argument("--host", default="127.0.0.1", help="address to serve on (default: loopback only)")
    p.add_argument("--port", type=int, default=8080)
    args = p.parse_args(argv)
    try:
        url = resolve(args.sweep, args.storage)
        open_storage(url).engine.dispose()  # a damaged study or a bad URL: one line here, not the server's traceback
        import optuna_dashboard
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except ImportError:
        print("error: optuna-dashboard is not installed: make install (it is in the dashboard extra)", file=sys.stderr)
        return 2
    print(f"optuna-dashboard on {redacted(url)}: http://{args.host}:{args.port}/", flush=True)
    optuna_dashboard.run_server(url, host=args.host, port=args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
