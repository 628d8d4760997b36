"""What the test servers (SeaweedFS for S3, tansu for Kafka) share: a process started in a
scratch folder that holds its log, killed and thrown away with the folder when done."""

from __future__ import annotations

import os
import shutil


class ScratchServer:
    """Mixin for a dataclass with `workdir` and `process` fields; `LOG` names the log file."""

    LOG = "server.log"

    def log_tail(self, lines: int = 30) -> str:
        try:
            with open(os.path.join(self.workdir, self.LOG), errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        # The data is thrown away, so a graceful shutdown (3-4 s for SeaweedFS) buys nothing.
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
