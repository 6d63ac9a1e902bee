"""What an operator gets for a file the process cannot use: one line naming the flag or file, exit 2 (a
setup error, which `league run` and supervisors do not retry), never a traceback; for a taken port, exit 3.

Each case runs the real `league` command in a subprocess. Before these checks a bad PEM made gRPC say only
"Failed to bind to address", and a missing token or CA file, a state file of another league or a busy port
ended in a traceback.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from common.exit_codes import ADDRESS_IN_USE_EXIT
from league_service.config import config_from_dict
from league_service.coordinator import Coordinator, CoordinatorSettings
from tests.full_disk import pretend_full_disk

ROOT = Path(__file__).resolve().parents[2]


def league(*argv: str, timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "league_cli", *argv], capture_output=True, text=True, timeout=timeout_s,
        env={"PATH": "/usr/bin:/bin"},
    )


def assert_setup_error(proc: subprocess.CompletedProcess[str], *expected: str, code: int = 2) -> None:
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    for text in expected:
        assert text in last, proc.stderr


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    shared = tmp_path / "shared"
    shared.mkdir()
    return {"garbage": garbage, "missing": tmp_path / "missing.pem", "shared": shared}


def test_coordinator_refuses_files_it_cannot_use(files):
    shared, garbage, missing = str(files["shared"]), str(files["garbage"]), str(files["missing"])
    base = ("coordinator", "--shared-root", shared, "--port", "0")
    assert_setup_error(league(*base, "--tls-cert", garbage, "--tls-key", garbage),
                       "--tls-cert/--tls-key", "not a PEM certificate chain")
    assert_setup_error(league(*base, "--token-file", missing), "--token-file", "No such file")
    assert_setup_error(league(*base, "--state", garbage), "state", "not an SQLite database (it begins b'not a ce")
    assert not Path(garbage + ".lock").exists()  # refused before a lock file was made beside the user's file
    # A mistyped or unmounted state volume: the coordinator made the folders and started an empty league there.
    nowhere = files["shared"].parent / "no" / "such" / "state.sqlite"
    assert_setup_error(league(*base, "--state", str(nowhere)), "--state", "does not exist: create it, or mount")
    assert not nowhere.parent.parent.exists()
    assert_setup_error(league(*base, "--state", garbage + "/state.sqlite"), "--state", "is not a directory")


def test_coordinator_refuses_the_state_of_another_league(files):
    shared = files["shared"]
    solo = config_from_dict({
        "league": {"league_type": "solo", "active_players": {"solo_active_player": 1}},
        "env": {"name": "CartPole-v1"},
    })
    Coordinator(solo, CoordinatorSettings(shared_root=shared)).close()
    proc = league("coordinator", "--shared-root", str(shared), "--port", "0")  # the default: a battle league
    assert_setup_error(proc, "the saved league is 'solo', the config says 'one_vs_one'")


def test_coordinator_says_when_its_port_is_taken(files):
    """A taken port is exit 3, not a setup error: it may be free again, or the server can move."""
    shared = str(files["shared"])
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = league("coordinator", "--shared-root", shared, "--port", str(port))
        assert_setup_error(proc, f"port: 127.0.0.1:{port} is in use by another process", code=ADDRESS_IN_USE_EXIT)
        assert "add_port" not in proc.stderr and "Errno" not in proc.stderr, proc.stderr  # gRPC's own line, before
        # A start that never served leaves no league behind for the next start to restore as its own.
        assert not list(Path(shared).glob("league_state*")), list(Path(shared).iterdir())
        proc = league("coordinator", "--shared-root", shared, "--port", "0", "--metrics-port", str(port))
        assert_setup_error(proc, f"--metrics-port: 127.0.0.1:{port} is in use by another process",
                           code=ADDRESS_IN_USE_EXIT)


@pytest.mark.parametrize("command", ["coordinator", "learner"])
def test_a_host_a_server_cannot_listen_on_is_named_as_the_host(files, command):
    """It said "port: could not bind nosuchhost.invalid:0: [Errno -2] ..." after gRPC's own log line (a review)."""
    shared = str(files["shared"])
    head = ("coordinator", "--shared-root", shared, "--insecure") if command == "coordinator" else (
        "learner", "--coordinator", "127.0.0.1:1", "--shared-root", shared, "--insecure")
    for host, said in (("nosuchhost.invalid", "host 'nosuchhost.invalid': no such address"),
                       ("192.0.2.1", "host '192.0.2.1' is no address of this machine")):
        proc = league(*head, "--host", host, "--port", "0")
        assert_setup_error(proc, said, f"cannot listen on {host}:0")
        assert "add_port" not in proc.stderr and "Errno" not in proc.stderr, proc.stderr


def test_coordinator_refuses_a_metrics_port_that_is_its_rpc_port(files):
    """Both bind on --host: it said '--metrics-port: 127.0.0.1:P is in use by another process' (exit 3, a taken
    port, which a supervisor retries) against its own RPC port."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    proc = league("coordinator", "--shared-root", str(files["shared"]), "--port", port, "--metrics-port", port)
    assert_setup_error(proc, f"--metrics-port: {port} is the RPC port")


def test_a_learner_says_when_an_outgoing_connection_holds_its_port(files):
    """How a restarted learner's old port gets taken on one machine: a connection made meanwhile was given it
    as its local port. `league run` then restarts the learner on a free port (it tells exit 3 apart)."""
    with socket.socket() as server, socket.socket() as client:
        server.bind(("127.0.0.1", 0))
        server.listen()
        client.connect(server.getsockname())
        port = client.getsockname()[1]
        proc = league("learner", "--coordinator", "127.0.0.1:1", "--shared-root", str(files["shared"]),
                      "--host", "127.0.0.1", "--port", str(port))
    assert_setup_error(proc, f"port: 127.0.0.1:{port} is in use by another process", code=ADDRESS_IN_USE_EXIT)


def test_coordinator_refuses_a_pretrained_checkpoint_that_is_not_under_the_shared_root(files, tmp_path):
    """Actors and learners would load it later and fail job after job; the coordinator says so at start."""
    config = tmp_path / "league.yaml"
    config.write_text("league: {pretrain_checkpoint_path: {default: sl/pretrained.pt}}\n")
    proc = league("coordinator", "--config", str(config), "--shared-root", str(files["shared"]), "--port", "0")
    assert_setup_error(proc, "league.pretrain_checkpoint_path.default: 'sl/pretrained.pt' does not exist under "
                       f"the shared root {files['shared']}")
    (files["shared"] / "sl" / "pretrained.pt").mkdir(parents=True)  # a directory of that name is no checkpoint
    proc = league("coordinator", "--config", str(config), "--shared-root", str(files["shared"]), "--port", "0")
    assert_setup_error(proc, "league.pretrain_checkpoint_path.default: 'sl/pretrained.pt' is not a regular file")


def test_a_port_file_in_no_directory_is_refused_before_serving(files):
    """Written once the server listened, it failed with a FileExistsError traceback and exit 1."""
    blocker = files["shared"] / "a-file"
    blocker.write_text("")
    proc = league("coordinator", "--shared-root", str(files["shared"]), "--port", "0",
                  "--port-file", str(blocker / "port"))
    assert_setup_error(proc, f"--port-file {blocker / 'port'}: cannot make its directory {blocker}")


def test_a_port_file_that_is_a_directory_or_cannot_be_written_is_refused_before_serving(files):
    """Checked only for its directory, both failed once the server listened: IsADirectoryError and
    FileNotFoundError tracebacks, exit 1 (/proc stands in for a directory no file can be made in: root here)."""
    folder = files["shared"] / "portdir"
    folder.mkdir()
    proc = league("coordinator", "--shared-root", str(files["shared"]), "--port", "0", "--port-file", str(folder))
    assert_setup_error(proc, f"--port-file {folder} is a directory")
    proc = league("coordinator", "--shared-root", str(files["shared"]), "--port", "0",
                  "--port-file", "/proc/league-port")
    assert_setup_error(proc, "--port-file /proc/league-port: cannot write in /proc")


@pytest.mark.parametrize(("flag", "value", "says"), [
    ("--port", "70000", "must be a port from 0 to 65535"),  # gRPC bound port 4464
    ("--metrics-port", "-1", "must be a port from 0 to 65535"),
    ("--lease-timeout", "0", "must be a finite number of seconds > 0"),  # a traceback before
    ("--lease-timeout", "nan", "must be a finite number of seconds > 0"),
    ("--seed", "-1", "must be >= 0"),  # numpy's traceback before
])
def test_coordinator_flags_out_of_range_are_usage_errors_naming_the_flag(files, flag, value, says):
    proc = league("coordinator", "--shared-root", str(files["shared"]), "--port", "0", flag, value)
    assert_setup_error(proc, f"argument {flag}: {says}")


@pytest.mark.parametrize(("value", "says"), [
    ("node-a", "expected HOST:PORT, got 'node-a'"),  # stored by the coordinator; actors retried UNAVAILABLE
    ("node-a:0", "the port must be from 1 to 65535"),
    (":7000", "expected HOST:PORT with a host"),
    ("dns:///node-a", "a gRPC target URI that ends with its port"),  # dialled on 443
])
def test_a_learner_refuses_an_advertised_address_actors_cannot_dial(files, value, says):
    proc = league("learner", "--coordinator", "127.0.0.1:1", "--shared-root", str(files["shared"]),
                  "--advertise", value)
    assert_setup_error(proc, "argument --advertise", says)


def test_workers_and_tools_refuse_a_bad_ca_or_token_file(files):
    shared, garbage, missing = str(files["shared"]), str(files["garbage"]), str(files["missing"])
    coordinator = ("--coordinator", "127.0.0.1:1", "--shared-root", shared)
    assert_setup_error(league("actor", *coordinator, "--tls-ca", missing), "--tls-ca", "No such file")
    assert_setup_error(league("learner", *coordinator, "--tls-ca", garbage, "--tls-cert", garbage, "--tls-key",
                              garbage), "--tls-ca", "no PEM CA certificate")
    assert_setup_error(league("status", "--addr", "127.0.0.1:1", "--tls-ca", garbage), "--tls-ca")
    assert_setup_error(league("status", "--addr", "127.0.0.1:1", "--token-file", missing), "--token-file")
    # A health probe's failure is exit 1, like an unreachable server; it still names the file.
    assert_setup_error(league("health", "--addr", "127.0.0.1:1", "--tls-ca", missing), "--tls-ca", code=1)


def test_a_learner_refuses_a_certificate_and_key_that_do_not_pair(files, tmp_path):
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make certificates")
    pems = {}
    for name in ("a", "b"):
        cert, key = tmp_path / f"{name}.crt", tmp_path / f"{name}.key"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                        str(cert), "-days", "1", "-subj", "/CN=localhost"], check=True, capture_output=True)
        pems[name] = (str(cert), str(key))
    proc = league("learner", "--coordinator", "127.0.0.1:1", "--shared-root", str(files["shared"]),
                  "--tls-ca", pems["a"][0], "--tls-cert", pems["a"][0], "--tls-key", pems["b"][1])
    assert_setup_error(proc, "--tls-cert/--tls-key", "KEY_VALUES_MISMATCH")


def test_a_second_coordinator_on_the_same_state_is_refused_and_names_the_first(files):
    """Two coordinators on one state file would each keep their own league and overwrite each other's commits."""
    shared = files["shared"]
    solo = config_from_dict({
        "league": {"league_type": "solo", "active_players": {"solo_active_player": 1}},
        "env": {"name": "CartPole-v1"},
    })
    first = Coordinator(solo, CoordinatorSettings(shared_root=shared))
    try:
        proc = league("coordinator", "--shared-root", str(shared), "--port", "0")
        assert_setup_error(proc, "is in use by pid", f"pid {os.getpid()} on {socket.gethostname()}",
                           "stop that one first")
    finally:
        first.close()


@pytest.mark.parametrize(
    ("kind", "said"),
    [
        ("symlink", ("is in use by pid", f"pid {os.getpid()} on {socket.gethostname()}", "stop that one first")),
        ("hard link", ("it has 2 names (hard links)", "remove the other names")),
    ],
)
def test_a_second_coordinator_on_the_same_state_through_a_link_is_refused(files, kind, said):
    """The lock file was named after the path as given: `--state link.sqlite`, a symlink to the first
    coordinator's state file, locked `link.sqlite.lock`, so a second coordinator served the same database (SQLite
    follows the link, WAL and all) beside the first; the lock sits beside the file the path resolves to now. A
    hard link is another name of the same file: it took another lock and SQLite another WAL; such a state is
    refused."""
    shared = files["shared"]
    solo = config_from_dict({
        "league": {"league_type": "solo", "active_players": {"solo_active_player": 1}},
        "env": {"name": "CartPole-v1"},
    })
    state = shared / "state.sqlite"
    first = Coordinator(solo, CoordinatorSettings(shared_root=shared, state_path=state))
    try:
        link = shared.parent / "link.sqlite"
        if kind == "symlink":
            link.symlink_to(state)
        else:
            link.hardlink_to(state)
        proc = league("coordinator", "--shared-root", str(shared), "--state", str(link), "--port", "0")
        assert_setup_error(proc, *said)
    finally:
        first.close()


def test_a_second_league_run_in_the_same_run_dir_is_refused_before_it_touches_anything(tmp_path):
    from common.exclusive_lock import ExclusiveLock

    run_dir = tmp_path / "run"
    (run_dir / "config.yaml").parent.mkdir()
    (run_dir / "config.yaml").write_text("the running run's\n")
    with ExclusiveLock(run_dir / "league_run.lock", "run directory"):
        proc = league("run", "--run-dir", str(run_dir), "--quiet")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"run directory {run_dir} is in use by pid {os.getpid()}" in " ".join((proc.stdout + proc.stderr).split())
    assert (run_dir / "config.yaml").read_text() == "the running run's\n"
    assert not (run_dir / "league_state.sqlite").exists()


def test_league_run_whose_logs_directory_cannot_be_made_says_so_and_leaves_no_pending_config(tmp_path):
    """`logs` a file in the run directory: a FileExistsError traceback, and config.pending.yaml left behind."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "logs").write_text("not a directory\n")
    proc = league("run", "--run-dir", str(run_dir), "--quiet", "--seconds", "5")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    said = " ".join((proc.stdout + proc.stderr).split())
    assert "Traceback" not in said and "cannot make its logs directory" in said, said
    assert not (run_dir / "config.pending.yaml").exists() and not (run_dir / "league_state.sqlite").exists()


def test_league_run_with_a_bad_flag_and_no_config_creates_no_run_directory(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "league_cli", "run", "--seconds", "-1"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert not (tmp_path / "runs").exists()


def test_coordinator_checks_the_run_section_of_its_config(files, tmp_path):
    """`run:` is `league run`'s section, but every key of a league config is checked (README): a typo there
    passed `league coordinator --config` silently, and the same file then failed under `league run`."""
    config = tmp_path / "league.yaml"
    config.write_text("run:\n  actorz: 2\n")
    assert_setup_error(league("coordinator", "--shared-root", str(files["shared"]), "--port", "0", "--config",
                              str(config), timeout_s=60.0), "run.actorz", "unknown key")
    config.write_text("run:\n  seconds: -5\n")
    assert_setup_error(league("eval", "--checkpoint", "p", "--shared-root", str(files["shared"]), "--config",
                              str(config), timeout_s=60.0), "run.seconds", "must be > 0")


def test_a_port_file_that_fails_to_be_written_once_serving_is_a_clear_exit(files, monkeypatch, caplog):
    """Its directory passes the check before serving, then the write fails (a full disk: what `league run`'s
    restart of a coordinator met once its run directory had filled). That was an OSError traceback; now one
    ERROR line naming the flag, the server stopped, exit 1 (a full disk may pass: not a setup error)."""
    import errno
    import gc
    import signal

    from league_cli.main import main

    def full_disk(path, port):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("league_service.cli.write_port_file", full_disk)
    port_file = files["shared"] / "port"
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        with caplog.at_level(logging.ERROR):
            code = main(["coordinator", "--shared-root", str(files["shared"]), "--port", "0", "--grace", "0",
                         "--port-file", str(port_file)])
    finally:  # (the coordinator's own, for the process it thinks it is)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        gc.unfreeze()
    assert code == 1
    assert f"--port-file {port_file}: cannot write the port (No space left on device)" in caplog.text
    assert not port_file.exists()


def test_a_state_that_cannot_be_opened_on_a_full_disk_is_a_failure_naming_the_disk(files, monkeypatch, capsys):
    """Restarted on a full disk, the coordinator could not open its state (SQLite cannot make the WAL's
    shared-memory file) and exited 2 with "state ...: disk I/O error": a setup error, as if the state could
    never be used. Now exit 1, naming the full disk. (A state SQLite refuses, a damaged database, stands in
    for the full disk's, and os.statvfs says the disk is full.)"""
    import gc
    import signal

    from league_cli.main import main
    from league_service.store import SQLITE_HEADER

    damaged = files["garbage"].with_name("damaged.sqlite")
    damaged.write_bytes(SQLITE_HEADER + b"not a database page\n" * 20)
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        with monkeypatch.context() as patched:
            pretend_full_disk(patched)
            code = main(["coordinator", "--shared-root", str(files["shared"]), "--port", "0",
                         "--state", str(damaged)])
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        gc.unfreeze()
    err = capsys.readouterr().err
    assert code == 1, err
    assert f"state {damaged}: file is not a database; the disk of {damaged.parent} is full" in err


def _certificate_with_dates(folder: Path, name: str, start: str, end: str) -> tuple[Path, Path]:
    """A self-signed certificate valid from `start` to `end` (YYYYMMDDHHMMSSZ): `openssl ca` sets any dates,
    `openssl req -x509` only a number of days from now."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make certificates")
    ca = folder / f"{name}-ca"
    ca.mkdir()
    (ca / "index.txt").write_text("")
    (ca / "serial").write_text("01\n")
    (ca / "ca.cnf").write_text(
        "[ca]\ndefault_ca = d\n[d]\ndatabase = index.txt\nnew_certs_dir = .\nserial = serial\ndefault_md = sha256\n"
        "policy = p\ncopy_extensions = copy\nunique_subject = no\n[p]\ncommonName = supplied\n"
    )
    cert, key = folder / f"{name}.pem", folder / f"{name}-key.pem"
    subprocess.run(["openssl", "req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(ca / "req.csr"), "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    subprocess.run(["openssl", "ca", "-batch", "-config", "ca.cnf", "-selfsign", "-keyfile", str(key), "-in",
                    "req.csr", "-out", str(cert), "-startdate", start, "-enddate", end, "-notext"],
                   check=True, capture_output=True, cwd=ca)
    return cert, key


def test_a_certificate_out_of_its_dates_is_refused_at_start_naming_them(files, tmp_path):
    """It loaded, paired with its key and served; then every handshake failed, which clients saw as UNAVAILABLE
    and retried for ever (their hint says to check the dates, the server said nothing)."""
    expired = _certificate_with_dates(tmp_path, "expired", "20200101000000Z", "20210101000000Z")
    future = _certificate_with_dates(tmp_path, "future", "20900101000000Z", "20910101000000Z")
    shared = str(files["shared"])
    proc = league("coordinator", "--shared-root", shared, "--port", "0", "--tls-cert", str(expired[0]),
                  "--tls-key", str(expired[1]))
    assert_setup_error(proc, "--tls-cert", "its certificate expired on 2021-01-01 00:00:00 UTC",
                       "this machine's clock says")
    proc = league("learner", "--coordinator", "127.0.0.1:1", "--shared-root", shared, "--tls-ca", str(future[0]),
                  "--tls-cert", str(future[0]), "--tls-key", str(future[1]))
    assert_setup_error(proc, "--tls-ca", "its certificate is not valid before 2090-01-01 00:00:00 UTC")
    assert_setup_error(league("status", "--addr", "127.0.0.1:1", "--tls-ca", str(expired[0])),
                       "--tls-ca", "expired on 2021-01-01")
    bundle = tmp_path / "bundle.pem"  # an expired CA beside a valid one, as in a system bundle: fine
    bundle.write_bytes(expired[0].read_bytes() + future[0].read_bytes())
    assert_setup_error(league("status", "--addr", "127.0.0.1:1", "--tls-ca", str(bundle)), "--tls-ca",
                       "every one of its 2 certificates is out of its dates, the latest is not valid before 2090")
    valid = _certificate_with_dates(tmp_path, "valid", "20200101000000Z", "20900101000000Z")
    bundle.write_bytes(expired[0].read_bytes() + valid[0].read_bytes())
    from common.rpc import check_server_tls, check_tls_ca

    check_tls_ca(bundle)
    check_server_tls(*valid)


def test_a_certificate_that_expires_within_a_week_is_said_at_start(tmp_path, caplog):
    from common.rpc import check_server_tls

    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make certificates")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "2", "-subj", "/CN=localhost"], check=True, capture_output=True)
    with caplog.at_level(logging.WARNING, logger="common.rpc"):
        check_server_tls(cert, key)
    assert f"--tls-cert: {cert} expires in 2.0 days" in caplog.text


@pytest.mark.parametrize("state", ["missing", "empty"])
def test_league_run_refuses_a_run_dir_whose_league_state_is_gone(tmp_path, state):
    """It started a new league over the old one's checkpoints and history, said only in the coordinator's log
    (and "resuming" for an emptied state file; a review)."""
    run_dir = tmp_path / "run"
    (run_dir / "shared").mkdir(parents=True)
    (run_dir / "config.yaml").write_text((ROOT / "configs" / "solo_cartpole.yaml").read_text())
    if state == "empty":
        (run_dir / "league_state.sqlite").write_bytes(b"")
    proc = league("run", "--run-dir", str(run_dir), "--seconds", "5", "--quiet")
    assert proc.returncode == 2 and "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert f"held a league (it has its config.yaml), but its state {run_dir / 'league_state.sqlite'} is {state}" in (
        proc.stdout), proc.stdout
    assert "resuming" not in proc.stdout and not (run_dir / "logs").exists()  # nothing started
    assert (state == "empty") == (run_dir / "league_state.sqlite").exists()


def test_league_run_refuses_a_league_without_its_config_unless_given_one(tmp_path):
    """It went on with the embedded league's settings (what the state does not hold: learning, snapshot and PFSP
    rules), unsaid, and wrote them as the directory's config.yaml (a review)."""
    from league_cli.run import _half_a_league
    from league_service.coordinator_testing import run_dir_holding

    run_dir = tmp_path / "run"
    solo = ROOT / "configs" / "solo_cartpole.yaml"
    run_dir_holding(run_dir, solo)
    (run_dir / "config.prev.yaml").write_text(solo.read_text())
    proc = league("run", "--run-dir", str(run_dir), "--seconds", "5", "--quiet")
    assert proc.returncode == 2 and "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert "holds a league (its state" in proc.stdout and "but not its config.yaml" in proc.stdout, proc.stdout
    assert str(run_dir / "config.prev.yaml") in proc.stdout and not (run_dir / "config.yaml").exists()
    assert _half_a_league(run_dir, given_config=True) is None  # `league run CONFIG --run-dir` goes on
    (run_dir / "config.yaml").write_text(solo.read_text())
    assert _half_a_league(run_dir, given_config=False) is None  # a whole league
