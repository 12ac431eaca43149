"""The benchmarks' fake OpenAI backend as a process of its own (bench/servers.py starts it): the server is the
test double in tests/fake_openai.py, which the product's tests use too.

    python bench/fake_openai.py --port 9100 [--tokens 16] [--token-delay-ms 0]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.fake_openai import main  # noqa: E402

if __name__ == "__main__":
    main()
