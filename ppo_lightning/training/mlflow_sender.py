"""MLflow records sent by a background thread, kept on disk while the tracking server is away.

The training loop hands every MLflow record of a run (the run's creation when the server was away at
start, parameters, one iteration's metrics, a tag, an artifact, the final status) to `MlflowSender`,
which never blocks it: records go to an in-memory queue (bounded; past the bound the loop appends them
to the backlog under a short lock) and one thread sends them, in order. When a send fails because the server cannot be
reached (connection refused, a timeout, a 5xx answer), the thread prints one line, writes what it has
not sent to a spool file (JSON lines, ``<run>/checkpoints/mlflow-spool.jsonl``, beside the
checkpoints) and retries every few seconds; when a send succeeds again it prints one line, sends the
backlog and removes the spool. What is still unsent when the process ends stays in the spool: a run
resumed from that folder sends it first (into the same MLflow run), and
``python -m ppo_lightning.training.mlflow_sender SPOOL`` imports it by hand.

The spool is a journal, so that a process killed at any moment (SIGKILL while the backlog is being
sent) neither loses a record nor sends one twice:
- while it holds unsent records, every new record is appended to it too (a record taken after the
  server came back is on disk until sent, like the backlog before it);
- after each batch the server acknowledged, a line ``{"kind": "sent", "n": K}`` (fsynced) says that the
  next K records are sent, and once the server created the run, ``{"kind": "run", "run_id": ...}``
  names it; a reader (`load_spool`) skips what is acknowledged;
- a kill between the server's answer and that line leaves one batch unacknowledged: a resumed sender
  asks the server once for the run's last ``frames`` step and drops metrics at or below it (sends are
  in order, so the server has every one of them). The other records are idempotent (a tag, a status,
  an artifact of the same path) or checked (parameters already logged are not logged again).

Why not MLflow's own asynchronous logging (``log_batch(..., synchronous=False)``): it does keep the
loop from waiting, but a batch whose send fails after the client's retries is dropped (an error in the
log, not kept), its queue has no bound, and nothing says when the server is away or back. Its
client-side retries (``MLFLOW_HTTP_REQUEST_MAX_RETRIES``, 7 by default with exponential backoff: a
request waits minutes on a dead server) are set to 0 and the request timeout to 30 s for this
process unless the user set them (`configure_http`): this thread does the retrying.

A full disk under a local store (SQLite) is not an outage: `fatal` holds a `StorageFull` that the
logger raises in the training loop (exit code 5); an artifact that does not fit is reported once and
skipped (training can go on without it).
"""

from __future__ import annotations

import collections
import json
import os
import queue
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from ppo_lightning.core.errors import StorageFull, human_bytes
from ppo_lightning.core.storage import atomic_replace, free_bytes, out_of_space, space_error_text, tree_bytes
from ppo_lightning.training.storage_faults import sqlite_path

SPOOL_NAME = "mlflow-spool.jsonl"
# MLflow 3.x's UI picks an experiment's view from this tag: untagged experiments open in the GenAI
# view ("Evaluation runs"); this kind opens on the training runs and their charts.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
QUEUE_SIZE = 10_000  # records handed over without a lock; past it the loop appends to the backlog itself
RETRY_S = (0.5, 1.0, 2.0, 5.0)  # waits between tries while the server is away


def local_artifact_folder(location: str | None) -> Path | None:
    """The folder of a local artifact location (``file:///...`` or a plain path); None for others."""
    if not location:
        return None
    if location.startswith("file:"):
        from urllib.parse import unquote, urlparse

        return Path(unquote(urlparse(location).path))
    return None if "://" in location else Path(location)


def _warn(message: str) -> None:
    print(f"[ppo-lightning] {message}", file=sys.stderr, flush=True)


def configure_http(timeout_s: int = 30, max_retries: int = 0) -> None:
    """Short HTTP requests for MLflow's REST client (the sender retries), unless set by the user."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(timeout_s))
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", str(max_retries))


def is_unreachable(err: BaseException) -> bool:
    """The server could not be reached or answered 5xx (an outage), not a request it refused (4xx)."""
    from mlflow.exceptions import RestException

    if isinstance(err, RestException):
        return err.get_http_status_code() >= 500
    text = str(err)
    return any(t in text for t in ("API request to", "Connection", "connection", "timed out", "Timeout",
                                   "Max retries exceeded", "Temporary failure", "database is locked"))


def local_store_busy(err: BaseException) -> bool:
    """A local (SQLite) store that is busy, not broken: locked by another writer, or SQLAlchemy's connection
    pool exhausted while many runs of a group write at once on a loaded machine (``QueuePool limit ...
    connection timed out``). The record is retried, as for a server that is away, never dropped."""
    text = str(err)
    return "database is locked" in text or "QueuePool limit" in text


def short_reason(err: BaseException | str) -> str:
    """A few words for an outage: ``connection refused``, ``timed out``, or the error's first line."""
    text = str(err)
    for needle, words in (("Connection refused", "connection refused"), ("timed out", "timed out"),
                          ("RemoteDisconnected", "connection closed"), ("Connection aborted", "connection closed"),
                          ("Name or service not known", "unknown host"), ("Temporary failure", "name resolution failed"),
                          ("Max retries exceeded", "no connection")):
        if needle in text:
            return words
    first = text.strip().splitlines()[0] if text.strip() else type(err).__name__
    return first[:150]


def read_spool(path: str | os.PathLike) -> list[dict]:
    """The lines of a spool file, as written (a last line cut by a kill is skipped)."""
    out = []
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def load_spool(path: str | os.PathLike) -> tuple[dict, list[dict]]:
    """The header of a spool file (``run_id`` updated by its ``run`` lines) and the records it holds
    that no ``sent`` line acknowledges, in order."""
    header: dict = {}
    records: list[dict] = []
    acknowledged = 0
    for line in read_spool(path):
        kind = line.get("kind")
        if kind == "header":
            header = {**line, "run_id": header.get("run_id") or line.get("run_id")}
        elif kind == "run":
            header["run_id"] = line.get("run_id")
        elif kind == "sent":
            acknowledged += int(line.get("n", 0))
        else:
            records.append(line)
    return header, records[acknowledged:]


class MlflowSender:
    """Sends MLflow records in order from a daemon thread (see the module docstring).

    ``run_id``: the run to log into; None: the first record must be ``create_run`` (the server was
    away at start). ``on_run_id``: called from the thread with the id once the run exists.
    ``local``: a store in a file of this machine (its out-of-space errors are fatal, not an outage).
    ``floor``: for a resumed run, live metrics at or below the run's last logged ``frames`` step are
    dropped (Lightning redoes the end of the checkpoint's iteration; the resumed run redoes the
    iterations after it).
    """

    def __init__(self, client, tracking_uri: str, run_id: str | None, spool: str | os.PathLike | None,
                 local: bool, resumed: bool = False, on_run_id: Callable[[str], None] | None = None,
                 away: bool = False) -> None:
        self.client, self.tracking_uri, self.run_id = client, tracking_uri, run_id
        self.spool = Path(spool) if spool is not None else None
        self.local, self.resumed, self.on_run_id = local, resumed, on_run_id
        self.fatal: StorageFull | None = None
        self.down = away  # the server did not answer at start (said then): records are spooled as they come
        self.sent = 0
        self._queue: queue.Queue = queue.Queue(QUEUE_SIZE)
        self._pending: collections.deque = collections.deque()  # taken from the queue, not yet sent
        self._spooled = 0  # records of _pending (the first ones) already in the spool file
        self._lock = threading.Lock()  # the spool file
        self._wake = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._closed = False
        self._floor: float | None = None
        self._warned: set[str] = set()
        self._artifact_space_warned = False
        header, kept = load_spool(self.spool) if self.spool is not None else ({}, [])  # an earlier process's
        self.run_id = self.run_id or header.get("run_id")
        for record in kept:
            record["live"] = False
            self._pending.append(record)
        self._spooled = len(self._pending)
        if self.spool is not None and self.spool.exists() and not kept:  # everything in it was sent
            self.spool.unlink(missing_ok=True)
        elif kept and self.spool is not None:  # rewritten with the unsent records only: acks start from 0
            self.persist()
        if any(r["kind"] == "metrics" for r in self._pending):
            self.resumed = True  # live metrics at or below the spooled ones' last step are dropped
        if self._pending:
            _warn(f"MLflow: {len(self._pending)} records kept in {self.spool} by an earlier run; sending them first")
            self._idle.clear()
        self._thread = threading.Thread(target=self._loop, name="mlflow-sender", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ the training loop's side
    def submit(self, record: dict) -> None:
        """Never blocks: past the queue's bound the record goes straight to the spool file."""
        if self.fatal is not None:
            raise self.fatal
        record = {**record, "live": True}
        self._idle.clear()
        if self._closed:  # a record after `stop` (the preemption's status): the thread again
            self._closed = False
            self._thread = threading.Thread(target=self._loop, name="mlflow-sender", daemon=True)
            self._thread.start()
        try:
            self._queue.put_nowait(record)
        except queue.Full:  # a long outage: straight to the backlog (and its spool), never waiting
            with self._lock:
                self._pending.append(record)
                self._journal()

    def flush(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for every record to be sent; True if they were."""
        deadline = time.monotonic() + timeout_s
        self._wake.set()  # a thread waiting to retry tries now
        while time.monotonic() < deadline:
            if self._idle.wait(min(0.05, max(0.0, deadline - time.monotonic()))) and self._queue.empty() \
                    and not self._pending:
                return True
        return False

    def stop(self) -> None:
        """End the thread (after `flush` / `persist`): what is unsent is in the spool, for a resumed run
        or the import command, not sent twice by a thread left behind."""
        self._closed = True
        self._wake.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=15)

    def creates_run(self) -> bool:
        """A ``create_run`` record is waiting (the spool of a run the server never saw)."""
        with self._lock:
            return any(r.get("kind") == "create_run" for r in self._pending)

    def persist(self) -> int:
        """Rewrite the spool with exactly the records not sent yet (header first); returns their count.
        The thread goes on trying."""
        with self._lock:
            while True:
                try:
                    self._pending.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            rest = list(self._pending)
            if self.spool is not None:
                if rest:
                    try:
                        atomic_replace(self.spool, lambda f: f.write(self._spool_text(rest, header=True).encode()))
                    except OSError as err:
                        self._spool_failed(err)
                else:
                    self.spool.unlink(missing_ok=True)
            self._spooled = len(rest)
        return len(rest)

    # ------------------------------------------------------------------ the thread
    def _loop(self) -> None:
        waits = iter(())
        while not self._closed:
            with self._lock:
                record = self._pending[0] if self._pending else None
            if record is None:
                try:
                    record = self._queue.get(timeout=0.2)
                except queue.Empty:
                    self._idle.set()
                    continue
                with self._lock:
                    self._pending.append(record)
                    self._journal()
            batch = self._metrics_run() if record["kind"] == "metrics" else [record]
            try:
                if record["kind"] == "metrics":
                    self._send_metrics(batch)  # consecutive iterations in one request: a backlog goes fast
                else:
                    self._send(record)
            except Exception as err:  # noqa: BLE001 - sorted below; the loop must go on
                if self.local and out_of_space(err) and record["kind"] != "artifact":
                    path = sqlite_path(self.tracking_uri) or Path(self.tracking_uri)
                    self.fatal = StorageFull("the MLflow tracking store", path, len(json.dumps(record)),
                                             free_bytes(path.parent), space_error_text(err))
                    self._drop_first()
                    self._closed = True
                    self._idle.set()
                    return
                if record["kind"] == "artifact" and out_of_space(err):
                    self._remove_partial_artifact(record)
                    if not self._artifact_space_warned:
                        self._artifact_space_warned = True
                        _warn(f"MLflow: {space_error_text(err)} while storing artifact {record['path']} (needs "
                              f"{human_bytes(tree_bytes(record['path']))}); no more artifacts are stored in this "
                              f"run, the files stay in the run folder; training goes on")
                    self._drop_first()
                    continue
                if not self.local and is_unreachable(err) or self.local and local_store_busy(err):
                    if not self.down:
                        self.down = True
                        _warn(f"MLflow tracking server {self.tracking_uri} is unreachable ({short_reason(err)}); training goes on, "
                              f"what it has not received is kept in {self.spool} and sent when it is back")
                        with self._lock:
                            self._write_spool(list(self._pending)[self._spooled:])
                            self._spooled = len(self._pending)
                        waits = iter(RETRY_S)
                    self._idle.set()
                    self._wake.wait(next(waits, RETRY_S[-1]))  # `flush` and `stop` wake it
                    self._wake.clear()
                    continue
                key = f"{record['kind']}:{type(err).__name__}"
                if key not in self._warned:  # a record the store refuses: said once per kind, skipped
                    self._warned.add(key)
                    _warn(f"MLflow {record['kind']} not logged ({type(err).__name__}: "
                          f"{str(err).strip().splitlines()[0][:200] if str(err).strip() else ''})")
                self._drop_first()
                continue
            if self.down:
                with self._lock:
                    left = len(self._pending) + self._queue.qsize()
            self._drop_first(len(batch))
            self.sent += len(batch)
            if self.down:
                self.down = False
                _warn(f"MLflow tracking server {self.tracking_uri} is back; sending the {left} records kept")
            if not self._pending and self._queue.empty():
                self._clear_spool()
                self._idle.set()

    def _journal(self) -> None:
        """(Lock held.) Away, or with unsent records in the spool: the records not in it yet go to it."""
        if (self.down or self._spooled) and len(self._pending) > self._spooled:
            self._write_spool(list(self._pending)[self._spooled:])
            self._spooled = len(self._pending)

    def _drop_first(self, n: int = 1) -> None:
        """The first ``n`` records are done (sent, or refused): their spool lines are acknowledged."""
        with self._lock:
            n = min(n, len(self._pending))
            for _ in range(n):
                self._pending.popleft()
            done = min(n, self._spooled)
            self._spooled -= done
            if done and self.spool is not None:
                if self._spooled == 0:  # nothing unsent left in the file
                    self.spool.unlink(missing_ok=True)
                else:
                    self._append_line({"kind": "sent", "n": done})

    def _metrics_run(self, limit: int = 250) -> list[dict]:
        """The metrics records at the head of the backlog (queued ones taken in first), up to ``limit``
        values: sent as one ``log_batch``."""
        with self._lock:
            while True:
                try:
                    record = self._queue.get_nowait()
                except queue.Empty:
                    break
                self._pending.append(record)
                self._journal()
            out, n = [], 0
            for record in self._pending:
                if record["kind"] != "metrics" or (out and n + len(record["metrics"]) > limit):
                    break
                out.append(record)
                n += len(record["metrics"])
            return out

    def _remove_partial_artifact(self, record: dict) -> None:
        """A local artifact store copies the file: a copy cut by a full disk is removed."""
        try:

            folder = local_artifact_folder(self.client.get_run(self.run_id).info.artifact_uri)
            if folder is not None:
                (folder / (record.get("artifact_path") or "") / Path(record["path"]).name).unlink(missing_ok=True)
        except Exception:  # noqa: BLE001 - a remote store keeps no partial file of ours
            pass

    # ------------------------------------------------------------------ spool file
    def _spool_text(self, records: list[dict], header: bool) -> str:
        """The spool's lines for ``records`` (``header``: the header line first)."""
        lines = [{"kind": "header", "tracking_uri": self.tracking_uri, "run_id": self.run_id}] if header else []
        lines += [{k: v for k, v in r.items() if k != "live"} for r in records]
        return "".join(json.dumps(line) + "\n" for line in lines)

    def _spool_failed(self, err: OSError) -> None:
        if "spool" not in self._warned:
            self._warned.add("spool")
            _warn(f"MLflow records cannot be kept in {self.spool} ({err.strerror}); they stay in memory")

    def _write_spool(self, records: list[dict]) -> None:
        """Append ``records`` to the spool (fsynced; the header first in a new spool)."""
        path = self.spool
        if path is None or not records:
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            new = not path.exists()
            with open(path, "a") as f:
                f.write(self._spool_text(records, header=new))
                f.flush()
                os.fsync(f.fileno())
        except OSError as err:
            self._spool_failed(err)

    def _clear_spool(self) -> None:
        """Everything sent: the spool is rewritten empty (removed)."""
        with self._lock:
            if self.spool is not None and self.spool.exists() and not self._spooled:
                self.spool.unlink(missing_ok=True)

    def _append_line(self, line: dict) -> None:
        """(Lock held.) One fsynced line at the end of an existing spool (an acknowledgement, the run id)."""
        try:
            if self.spool is not None and self.spool.exists():
                with open(self.spool, "a") as f:
                    f.write(json.dumps(line) + "\n")
                    f.flush()
                    os.fsync(f.fileno())
        except OSError:
            pass  # unacknowledged: a resumed sender skips metrics the server has; the rest is idempotent

    # ------------------------------------------------------------------ one record
    def _send(self, record: dict) -> None:
        kind = record["kind"]
        if kind == "header":
            return
        if kind == "create_run":
            if self.run_id is None:
                self.run_id = create_run(self.client, record["experiment"], record.get("tags") or {})
                with self._lock:
                    self._append_line({"kind": "run", "run_id": self.run_id})
                if self.on_run_id is not None:
                    self.on_run_id(self.run_id)
            return
        if self.run_id is None:
            raise RuntimeError("no MLflow run yet")
        if kind == "metrics":
            self._send_metrics([record])
        elif kind == "params":
            self._send_params(record)
        elif kind == "tag":
            self.client.set_tag(self.run_id, record["key"], record["value"])
        elif kind == "artifact":
            if Path(record["path"]).exists() and not self._artifact_space_warned:
                self.client.log_artifact(self.run_id, record["path"], record.get("artifact_path"))
        elif kind == "terminated":
            self.client.set_terminated(self.run_id, record["status"])
        else:
            raise ValueError(f"unknown record kind {kind!r}")

    def _send_metrics(self, records: list[dict]) -> None:
        from mlflow.entities import Metric

        if self.run_id is None:
            raise RuntimeError("no MLflow run yet")
        metrics, top = [], None
        for record in records:
            step = int(record["step"])
            if self.resumed and "frames" in record["metrics"]:  # kept or live: the server may have it
                if self._floor is None:
                    history = self.client.get_metric_history(self.run_id, "frames")
                    self._floor = max((m.step for m in history), default=-1)
                if step <= self._floor:
                    continue
                top = step if top is None else max(top, step)
            metrics += [Metric(key=k, value=float(v), timestamp=int(record["timestamp"]), step=step)
                        for k, v in record["metrics"].items()]
        for i in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[i:i + 1000])
        if top is not None:
            self._floor = max(self._floor, top)

    def _send_params(self, record: dict) -> None:
        from mlflow.entities import Param

        params = {k: str(v)[:250] for k, v in record["params"].items()}
        if self.resumed:  # parameters are immutable: new ones are logged, changed ones go to a tag
            data = self.client.get_run(self.run_id).data
            old = data.params
            changed = {k: v for k, v in params.items() if k in old and old[k] != v}
            if changed:
                previous = data.tags.get("resumed_with", "")
                text = "; ".join(f"{k}={v}" for k, v in changed.items())
                self.client.set_tag(self.run_id, "resumed_with", f"{previous} | {text}" if previous else text)
            params = {k: v for k, v in params.items() if k not in old}
        items = [Param(k, v) for k, v in params.items()]
        for i in range(0, len(items), 100):
            self.client.log_batch(self.run_id, params=items[i:i + 100])


def create_run(client, experiment_name: str, tags: dict[str, str]) -> str:
    """Create a run in the experiment (made, with the training-view tag, if needed); its id."""

    experiment = client.get_experiment_by_name(experiment_name)
    if experiment is None or experiment.lifecycle_stage == "deleted":
        experiment_id = client.create_experiment(experiment_name, tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
    else:
        experiment_id = experiment.experiment_id
    from mlflow.tracking.context.registry import resolve_tags  # MLflow's context tags (user, source), as Lightning adds them

    return client.create_run(experiment_id=experiment_id, tags=resolve_tags(tags)).info.run_id


def import_spool(path: str | os.PathLike, tracking_uri: str | None = None) -> tuple[str | None, int]:
    """Send a spool file's unsent records to its run (a new one if the run was never created); returns
    the run id and the number of records sent. Each record sent is acknowledged in the file (an import
    cut short and run again sends the rest); the file is removed when all were sent."""
    import mlflow

    header, records = load_spool(path)
    uri = tracking_uri or header.get("tracking_uri")
    if uri is None:
        raise ValueError(f"{path}: no tracking URI in the spool; give --tracking_uri")
    configure_http()
    sender = MlflowSender.__new__(MlflowSender)  # the sending code, without the thread
    sender.client, sender.tracking_uri, sender.run_id = mlflow.MlflowClient(tracking_uri=uri), uri, header.get("run_id")
    sender.spool, sender._lock = Path(path), threading.Lock()
    sender.resumed, sender.on_run_id, sender._floor = True, None, None  # metrics the run has are not sent again
    for record in records:
        if not (record["kind"] == "create_run" and sender.run_id):
            sender._send(record)
        with sender._lock:
            sender._append_line({"kind": "sent", "n": 1})
    Path(path).unlink(missing_ok=True)
    return sender.run_id, len(records)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m ppo_lightning.training.mlflow_sender",
                                     description="Import the MLflow records a run kept while its tracking server was away.")
    parser.add_argument("spool", help=f"the spool file (<run>/checkpoints/{SPOOL_NAME})")
    parser.add_argument("--tracking_uri", default=None, help="default: the one the run used")
    args = parser.parse_args(argv)
    try:
        run_id, n = import_spool(args.spool, args.tracking_uri)
    except Exception as err:  # noqa: BLE001 - one line
        print(f"error: {type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}",
              file=sys.stderr)
        return 1
    print(f"sent {n} records to MLflow run {run_id}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
