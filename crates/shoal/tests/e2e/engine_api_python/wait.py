# The wait both SDK scripts use: engine_api_python.rs puts this file before each of them.
import time


def wait(what, cond, limit=90.0):
    """Polls cond() until it returns something true, for at most limit seconds."""
    deadline = time.monotonic() + limit
    last = None
    while time.monotonic() < deadline:
        last = cond()
        if last:
            return last
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")
