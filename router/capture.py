"""Opt-in prompt capture for continuous adaptation: one JSONL file per detected language.

Records follow the training prompt schema (id, lang, domain, prompt, source, license), so
``$POLYSPEC_HOME/capture/fr.jsonl`` can be fed to the training pipeline as it is.
"""

from __future__ import annotations

import json
import re
import threading
import uuid
from pathlib import Path

_SAFE_LANG = re.compile(r"^[a-z]{2,3}(-[a-z0-9]+)?$")


class PromptCapture:
    def __init__(self, directory: Path, router_id: str) -> None:
        self.directory = directory
        self.router_id = router_id
        self._lock = threading.Lock()

    def path_for(self, language: str) -> Path:
        return self.directory / f"{language}.jsonl"

    def write(self, language: str, domain: str, prompt: str) -> bool:
        """Append one prompt; languages that are not plain codes are refused (they name files)."""
        if not prompt.strip() or not _SAFE_LANG.match(language):
            return False
        record = {
            "id": f"capture-{language}-{uuid.uuid4().hex[:16]}",
            "lang": language,
            "domain": domain,
            "prompt": prompt,
            "source": f"polyspec-router:{self.router_id}",
            "license": "user-provided",
        }
        line = json.dumps(record, ensure_ascii=False) + "\n"
        with self._lock:
            self.directory.mkdir(parents=True, exist_ok=True)
            # One write() of one line in append mode: concurrent routers never interleave inside a record.
            with self.path_for(language).open("a", encoding="utf-8") as fh:
                fh.write(line)
        return True
