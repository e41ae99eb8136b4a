"""Starting `ds41 serve` from a test script (imported by the scripts beside this file)."""
import re
import subprocess
import threading

BANNER = re.compile(r"ds41 serve: .* on http://127\.0\.0\.1:(\d+)")


def start_server(cmd):
    """Starts `ds41 serve --port 0 ...`: the server binds a free port itself and its banner says
    which (a port picked here could be taken by another test's process first). Returns (process,
    port or None, stderr lines so far); stderr goes on being read so the server never blocks on it."""
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    lines, port = [], None
    for line in proc.stderr:
        lines.append(line)
        m = BANNER.search(line)
        if m:
            port = int(m.group(1))
            break
    threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True).start()
    return proc, port, lines
