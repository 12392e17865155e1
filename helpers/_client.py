"""The load generator's engine: a lean HTTP/1.1 client over keep-alive connections.

Learners never call this module; `helpers.load.run_load` (lesson 01) drives it, by default in
a child process started as `python -I helpers/_client.py` so that the notebook kernel's own
work (plotting, the GIL) does not slow the client down. It uses only the standard library, so
the child starts in a few tens of milliseconds and never imports pandas.

Why raw sockets and one event loop: on a 2-core machine the client shares the CPU with the
server it measures, so every microsecond and every context switch the client spends is taken
from the server. Closed and open loops therefore run as one epoll loop per process: each
"client thread" of the closed loop is a connection that sends its next request as soon as the
previous one returns, exactly as a thread would, without a thread's wake-ups and GIL hand-offs.
(Measured on the reference 2-core box against /health: threads reached ~0.77x wrk, this loop
~1.0x.) A burst needs requests released at one instant by a barrier, so bursts use real
threads, each with its own blocking socket.

Each request is one precomposed `send` and usually one `recvmsg`; only the few headers needed
to find the end of a response are looked at while the run is under way. Server-Timing and the
X-Worker-* headers are parsed after the run, when the CPU no longer matters. The kernel stamps
every received packet (SO_TIMESTAMPNS), so the client also measures how long each response
waited before the client read it: its own contribution to the latency it reports.

Protocol with the parent (isolate=True):
  stdin:  one JSON line (the plan), then command lines: "go <epoch>" and "stop".
          End of stdin means the parent died: the child exits at once.
  stdout: "ready <pid>", "progress <n>" (about 5 per second), "result <n bytes>" followed by
          that many bytes (the pickled results), then "done".
The child also dies with its parent (PR_SET_PDEATHSIG) and quits by itself at a hard
deadline (duration + timeout + margin), writing whatever it has.
"""

from __future__ import annotations

import collections
import errno
import heapq
import itertools
import json
import math
import os
import pickle
import select
import socket
import struct
import sys
import threading
import time

ERRORS = ("refused", "reset", "timeout", "http_4xx", "http_5xx", "other")
OK, REFUSED, RESET, TIMEOUT, HTTP_4XX, HTTP_5XX, OTHER = range(7)
ERROR_NAMES = ("",) + ERRORS

MAX_HEAD_BYTES = 65536
REFUSED_GIVE_UP_S = 1.0      # a closed loop stops when every attempt for this long was refused
REFUSED_BACKOFF_S = 0.01     # ...and pauses this long after each refusal, so rows stay bounded
RETRY_WINDOW_S = 0.05        # a reused connection that fails this soon was closed by the server beforehand
STOP_GRACE_S = 1.0           # after "stop", requests in flight get this long to finish
HARD_MARGIN_S = 3.0
LOOP_TICK_S = 0.05           # the event loop looks at the clock at least this often
# Linux SO_TIMESTAMPNS: the kernel stamps each received packet, so the client can tell how long
# a response sat in its socket before the client got round to reading it.
SO_TIMESTAMPNS = 35 if sys.platform.startswith("linux") else None
THREAD_STACK_BYTES = 256 * 1024

perf = time.perf_counter
_TIMESPEC = struct.Struct("qq")


class _Failure(Exception):
    """A request ended without a usable response (an error class, and whether bytes came back)."""

    def __init__(self, code: int, got_bytes: bool = False, status: int = 0):
        super().__init__(code)
        self.code, self.got_bytes, self.status = code, got_bytes, status


def _timeval(seconds: float) -> bytes:
    seconds = max(seconds, 0.001)
    whole = int(seconds)
    return struct.pack("ll", whole, int((seconds - whole) * 1e6))


def _os_error_code(exc: OSError) -> int:
    if isinstance(exc, (socket.timeout, BlockingIOError)):
        return TIMEOUT  # blocking sockets with SO_RCVTIMEO/SO_SNDTIMEO report EAGAIN on timeout
    if isinstance(exc, ConnectionRefusedError):
        return REFUSED
    if isinstance(exc, (ConnectionResetError, BrokenPipeError, ConnectionAbortedError)):
        return RESET
    return _errno_code(exc.errno)


def _errno_code(number: int | None) -> int:
    if number == errno.ECONNREFUSED:
        return REFUSED
    if number in (errno.ECONNRESET, errno.EPIPE, errno.ECONNABORTED):
        return RESET
    if number in (errno.ETIMEDOUT, errno.EINPROGRESS, errno.EAGAIN):
        return TIMEOUT
    return OTHER


def _arrival_delay_s(ancillary, now_epoch: float) -> float:
    """How long the first packet waited in the socket before it was read (-1 if unknown)."""
    for level, kind, payload in ancillary:
        if kind == SO_TIMESTAMPNS and level == socket.SOL_SOCKET and len(payload) >= 16:
            sec, nsec = _TIMESPEC.unpack_from(payload)
            return now_epoch - sec - nsec * 1e-9
    return -1.0


def _thread_schedstat() -> tuple[float, float] | None:
    """(CPU seconds, seconds spent runnable but waiting for a core) of the calling thread, if Linux says."""
    try:
        with open("/proc/thread-self/schedstat") as fh:
            run_ns, wait_ns = fh.read().split()[:2]
        return int(run_ns) / 1e9, int(wait_ns) / 1e9
    except (OSError, ValueError):
        return None


def _new_socket(blocking: bool, timeout_s: float = 0.0):
    """A TCP socket with the client's options set, not yet connected."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if SO_TIMESTAMPNS is not None:
            try:
                sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            except OSError:
                pass
        if blocking:
            # Blocking socket + kernel timeouts: one syscall per recv, where Python's own
            # timeout mode would poll() first and take the GIL twice.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, _timeval(timeout_s))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(timeout_s))
        else:
            sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


class Response:
    """An HTTP/1.1 response read incrementally: feed() bytes until it says the response is complete.

    Handles Content-Length, chunked and close-delimited bodies, interim 1xx responses, and
    HTTP/1.0 keep-alive rules. `keep` says whether the connection may be reused afterwards.
    """

    __slots__ = ("buf", "got", "status", "head", "keep", "framing", "body_start", "length", "scan", "trailers")

    def __init__(self):
        self.buf = b""
        self.got = False
        self.status = 0
        self.head = None
        self.keep = True
        self.framing = ""
        self.body_start = 0
        self.length = 0
        self.scan = 0
        self.trailers = False

    def feed(self, data: bytes) -> bool:
        """Add received bytes; True once the response is complete. Raises _Failure on garbage."""
        self.got = True
        self.buf += data
        if self.head is None and not self._parse_head():
            return False
        return self._body_complete()

    def eof(self) -> bool:
        """The server closed the connection: True if that completes the response."""
        if self.head is not None and self.framing == "close":
            self.keep = False
            return True
        return False

    def _parse_head(self) -> bool:
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buf) > MAX_HEAD_BYTES:
                    raise _Failure(OTHER, True)
                return False
            head = self.buf[:end]
            if head[:5] != b"HTTP/":
                raise _Failure(OTHER, True)
            try:
                status = int(head[9:12])
            except ValueError:
                raise _Failure(OTHER, True) from None
            if 100 <= status < 200 and status != 101:  # interim response: the real one follows
                self.buf = self.buf[end + 4:]
                continue
            break
        self.status, self.head, self.body_start = status, head, end + 4
        lower = head.lower()
        if head[5:8] == b"1.0":
            self.keep = b"\r\nconnection: keep-alive" in lower
        else:
            self.keep = b"\r\nconnection: close" not in lower
        if status in (204, 304):
            self.framing = "none"
            return True
        i = lower.find(b"\r\ncontent-length:")
        if i >= 0:
            j = lower.find(b"\r\n", i + 17)
            try:
                self.length = int(lower[i + 17:j if j >= 0 else len(lower)])
            except ValueError:
                raise _Failure(OTHER, True, status) from None
            self.framing = "length"
            return True
        i = lower.find(b"\r\ntransfer-encoding:")
        j = lower.find(b"\r\n", i + 2) if i >= 0 else -1
        if i >= 0 and b"chunked" in lower[i:j if j >= 0 else len(lower)]:
            self.framing, self.scan = "chunked", self.body_start
            return True
        self.framing = "close"  # neither: the body runs until the server closes the connection
        return True

    def _body_complete(self) -> bool:
        framing = self.framing
        if framing == "length":
            have = len(self.buf) - self.body_start
            if have > self.length:
                self.keep = False  # bytes beyond the body: do not trust this connection again
            return have >= self.length
        if framing == "none":
            if len(self.buf) > self.body_start:
                self.keep = False
            return True
        if framing == "chunked":
            return self._scan_chunks()
        return False

    def _scan_chunks(self) -> bool:
        buf, pos = self.buf, self.scan
        while True:
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                self.scan = pos
                return False
            if self.trailers:
                if eol == pos:  # the empty line after the trailers
                    if eol + 2 < len(buf):
                        self.keep = False
                    return True
                pos = eol + 2
                continue
            try:
                size = int(buf[pos:eol].split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise _Failure(OTHER, True, self.status) from None
            if size == 0:
                self.trailers = True
                pos = eol + 2
                continue
            need = eol + 2 + size + 2
            if len(buf) < need:
                self.scan = pos  # read this size line again when more has arrived
                return False
            pos = need


# ---- bursts: one thread and one blocking socket per request --------------------------------

class Connection:
    """One blocking TCP connection, as a burst thread uses it."""

    __slots__ = ("addr", "timeout_s", "sock", "ready_socket")

    def __init__(self, addr: tuple, timeout_s: float, ready_socket=None):
        self.addr = addr
        self.timeout_s = timeout_s
        self.sock = None
        self.ready_socket = ready_socket  # made before the release, so only connect() is left

    def open(self, deadline: float) -> float:
        """Connect; return the seconds it took. Raises _Failure."""
        t0 = perf()
        sock, self.ready_socket = self.ready_socket, None
        try:
            if sock is None:
                sock = _new_socket(True, self.timeout_s)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, _timeval(deadline - t0))
            sock.connect(self.addr)
            now = perf()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, _timeval(self.timeout_s))
            # what is left of this request's timeout (a slow connect, SYN retransmits, ate some)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(deadline - now))
        except OSError as exc:
            if sock is not None:
                sock.close()
            raise _Failure(_os_error_code(exc)) from None
        self.sock = sock
        return now - t0

    def close(self) -> None:
        for sock in (self.sock, self.ready_socket):
            if sock is not None:
                try:
                    sock.close()
                except OSError:
                    pass
        self.sock = self.ready_socket = None


def roundtrip(sock, request: bytes, deadline: float) -> tuple:
    """Send one request on a blocking socket and read its whole response.

    Returns (status, head bytes, keep_alive, seconds the response waited before it was read).
    """
    try:
        sock.sendall(request)
        data, ancillary, _, _ = sock.recvmsg(65536, 64)
        delay_s = _arrival_delay_s(ancillary, time.time())
    except OSError as exc:
        raise _Failure(_os_error_code(exc), False) from None
    if not data:
        raise _Failure(RESET, False)  # closed before any response byte
    response = Response()
    while not response.feed(data):
        try:
            data = sock.recv(65536)
        except OSError as exc:
            raise _Failure(_os_error_code(exc), True, response.status) from None
        if not data:
            if response.eof():
                break
            raise _Failure(RESET, True, response.status)
        if perf() > deadline:
            raise _Failure(TIMEOUT, True, response.status)
    return response.status, response.head, response.keep, delay_s


def hard_span_s(plan: dict) -> float:
    """Longest a plan may run from its start: duration + timeout + margin (bursts: timeout + margin)."""
    timeout_s = float(plan["timeout_s"])
    if plan["mode"] == "burst":
        span = timeout_s
    elif plan.get("duration_s") is not None:
        span = float(plan["duration_s"]) + timeout_s
    else:  # a request count: bounded by the longest run the course allows
        span = float(plan.get("max_duration_s", 3600)) + timeout_s
    return span + HARD_MARGIN_S


# ---- the engine ---------------------------------------------------------------------------

class Target:
    """One URL to load: its address and its request bytes, composed once."""

    def __init__(self, url: str):
        from urllib.parse import urlsplit

        parts = urlsplit(url)
        host = parts.hostname or "127.0.0.1"
        ip = "127.0.0.1" if host == "localhost" else host
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        self.url = url
        self.addr = (ip, parts.port or 80)
        host_header = parts.netloc.rsplit("@", 1)[-1]
        self.request = (f"GET {path} HTTP/1.1\r\nHost: {host_header}\r\n"
                        f"User-Agent: webperf-course\r\nAccept: */*\r\n\r\n").encode("latin-1")


IDLE, CONNECTING, SENDING, RECEIVING = range(4)


class _Slot:
    """One client connection of the event loop: a closed-loop client, or an open-loop sender."""

    __slots__ = ("i", "no", "tgt", "sock", "fd", "state", "watched", "response", "out", "intended", "index",
                 "send", "connect_t0", "connect_s", "reused", "retried", "delay_s", "seq")

    def __init__(self, i: int, no: int, tgt: int):
        self.i, self.no, self.tgt = i, no, tgt
        self.sock = None
        self.fd = -1
        self.state = IDLE
        self.watched = 0
        self.response = None
        self.out = b""
        self.intended = self.send = self.connect_t0 = self.connect_s = 0.0
        self.index = -1
        self.reused = self.retried = False
        self.delay_s = -1.0
        self.seq = 0


class Engine:
    """Runs one plan (closed, burst or open loop) in this process.

    A plan is a dict: urls, threads (list of [client_thread, url_index]), mode, duration_s,
    requests (closed-loop cap), schedule (open loop: list of [request_index, offset_s]),
    timeout_s. Closed and open loops run in one event-loop thread; a burst runs one thread
    per request. Either way each client keeps its own keep-alive connection.
    """

    def __init__(self, plan: dict):
        self.plan = plan
        self.mode = plan["mode"]
        self.targets = [Target(u) for u in plan["urls"]]
        self.threads_spec = [tuple(t) for t in plan["threads"]]
        self.timeout_s = float(plan["timeout_s"])
        self.duration_s = plan.get("duration_s")
        self.records = [[] for _ in self.threads_spec]
        self.inflight = [False] * len(self.threads_spec)
        self.retried = [0] * len(self.threads_spec)
        self._stop = False
        self._abandon = False
        self.stop_reason = ""
        self.stop_perf = None
        self.start_perf = None
        self.end_perf = math.inf
        self.threads: list[threading.Thread] = []
        self._last_response_perf = 0.0
        self._limit = plan.get("requests")
        self._schedule = plan.get("schedule") or []
        parties = len(self.threads_spec) if self.mode == "burst" else 1
        self._barrier = threading.Barrier(parties + 1)  # the client threads and go()'s caller
        self._cpu0 = None
        self.cpu_s = 0.0
        self.wall_s = 0.0
        self.finished_perf = None
        self.abandoned = 0
        self.snapshot = None
        self.loop_cpu_percent = self.loop_wait_percent = None
        # perf_counter -> epoch: one anchor per process, taken together
        self.anchor_wall, self.anchor_perf = time.time(), perf()

    # -- lifecycle --
    def prepare(self) -> None:
        """Start the client thread(s); they wait at a barrier until go()."""
        if self.mode != "burst":
            thread = threading.Thread(target=self._guard, args=(self._loop,), daemon=True, name="load-loop")
            thread.start()
            self.threads.append(thread)
            return
        old = threading.stack_size()
        try:
            threading.stack_size(THREAD_STACK_BYTES)
        except (ValueError, RuntimeError):
            old = None
        try:
            for slot, (tno, tgt) in enumerate(self.threads_spec):
                thread = threading.Thread(target=self._guard, args=(self._burst, slot, tgt), daemon=True,
                                          name=f"load-{tno}")
                thread.start()
                self.threads.append(thread)
        finally:
            if old is not None:
                threading.stack_size(old)

    def go(self, start_epoch: float) -> None:
        """Release the client; the run's clock starts at start_epoch (a moment just ahead)."""
        self.start_perf = self.anchor_perf + (start_epoch - self.anchor_wall)
        if self.duration_s is not None:
            self.end_perf = self.start_perf + float(self.duration_s)
        self._cpu0 = (time.process_time(), perf())  # CPU of this whole process, all threads
        self._barrier.wait(timeout=60)

    def stop(self, reason: str = "stopped") -> None:
        """Send nothing more (requests in flight may still finish)."""
        if not self._stop:
            self.stop_reason = reason
            self.stop_perf = perf()
        self._stop = True

    def hard_deadline_perf(self) -> float:
        """When the run must be over whatever happens."""
        return self.start_perf + hard_span_s(self.plan)

    def wait(self, on_progress=None, interval_s: float = 0.2) -> None:
        """Block until the client is done, the hard deadline passes, or stop() plus a grace."""
        hard = self.hard_deadline_perf()
        grace_end = None
        while True:
            alive = [t for t in self.threads if t.is_alive()]
            if not alive:
                break
            now = perf()
            if self._stop and grace_end is None:
                grace_end = now + STOP_GRACE_S
            if now >= hard:
                self.stop("hard deadline")
                break
            if grace_end is not None and now >= grace_end:
                break
            alive[0].join(min(interval_s, max(hard - now, 0.001)))
            if on_progress is not None:
                on_progress(self.completed())
        self._finish()

    def completed(self) -> int:
        """Requests with an outcome so far."""
        return sum(len(r) for r in self.records)

    def _finish(self) -> None:
        self.finished_perf = perf()
        self._stop = True
        if self._cpu0 is not None:
            self.cpu_s = time.process_time() - self._cpu0[0]
            self.wall_s = max(self.finished_perf - max(self._cpu0[1], self.start_perf or 0), 1e-9)
        self.snapshot = [list(r) for r in self.records]  # late finishers are not counted
        self.abandoned = sum(self.inflight)
        self._abandon = True

    def _guard(self, body, *args):
        if self.mode == "burst":  # only connect() is left for after the release
            try:
                args += (_new_socket(True, self.timeout_s),)
            except OSError:
                args += (None,)
        try:
            self._barrier.wait(timeout=60)
        except threading.BrokenBarrierError:
            return
        delay = self.start_perf - perf()
        if delay > 0:
            time.sleep(delay)
        try:
            body(*args)
        except Exception as exc:  # a bug, not a request error: end the run and say why
            self.stop(f"a client thread failed ({exc!r})")
            import traceback

            traceback.print_exc(file=sys.stderr)

    def _record(self, slot: int, no: int, tgt: int, index: int, intended: float, send: float, connect_s: float,
                status: int, err: int, head: bytes, delay_s: float) -> None:
        end = perf()
        if status:
            self._last_response_perf = end
        self.records[slot].append((no, tgt, index, intended, send, end, connect_s, status, err, head, delay_s))
        self.inflight[slot] = False

    def _gave_up_on_refusals(self) -> bool:
        """True (and the run stops) when attempts have been refused for a while with no response."""
        if perf() - max(self._last_response_perf, self.start_perf) > REFUSED_GIVE_UP_S:
            self.stop("connections refused: nothing is listening on that port")
            return True
        return False

    # -- a burst: one blocking request per thread --
    def _burst(self, slot: int, tgt: int, ready_socket) -> None:
        conn = Connection(self.targets[tgt].addr, self.timeout_s, ready_socket)
        if self._stop:
            return conn.close()
        send = perf()
        deadline = send + self.timeout_s
        connect_s, status, head, err, delay_s = 0.0, 0, b"", OK, -1.0
        self.inflight[slot] = True
        try:
            connect_s = conn.open(deadline)
            status, head, _, delay_s = roundtrip(conn.sock, self.targets[tgt].request, deadline)
            if status >= 400:
                err = HTTP_5XX if status >= 500 else HTTP_4XX
        except _Failure as failure:
            err, status = failure.code, failure.status
        finally:
            conn.close()
        self._record(slot, self.threads_spec[slot][0], tgt, -1, self.start_perf, send, connect_s, status, err, head,
                     delay_s)

    # -- closed and open loops: one epoll loop over every connection --
    def _loop(self) -> None:
        self._ep = select.epoll()
        self._by_fd: dict[int, _Slot] = {}
        self._timers: list = []  # heap of (when, tie, slot index, request seq or -1 for a wake-up)
        self._tie = itertools.count()
        self._ready = collections.deque()
        self._slots = [_Slot(i, no, tgt) for i, (no, tgt) in enumerate(self.threads_spec)]
        self._issued = 0
        self._inflight_n = 0
        self._pending = collections.deque()  # open loop: arrivals due, waiting for an idle sender
        self._idle = self._slots[::-1]        # open loop: a stack, so a few connections stay warm
        self._next = 0                         # open loop: the next schedule entry
        if self.mode == "closed":
            self._ready.extend(self._slots)
        sched0, t0 = _thread_schedstat(), perf()
        try:
            self._run_loop()
        finally:
            for slot in self._slots:
                self._close(slot)
            self._ep.close()
            sched1, t1 = _thread_schedstat(), perf()
            if sched0 and sched1:  # this thread's own CPU and run-queue wait, as shares of the wall time
                self.loop_cpu_percent = 100.0 * (sched1[0] - sched0[0]) / max(t1 - t0, 1e-9)
                self.loop_wait_percent = 100.0 * (sched1[1] - sched0[1]) / max(t1 - t0, 1e-9)

    def _run_loop(self) -> None:
        ep, timers, ready, slots = self._ep, self._timers, self._ready, self._slots
        open_loop = self.mode == "open"
        schedule, start = self._schedule, self.start_perf
        while not self._abandon:
            now = perf()
            while timers and timers[0][0] <= now:
                _, _, i, seq = heapq.heappop(timers)
                slot = slots[i]
                if seq < 0:
                    ready.append(slot)  # a back-off is over
                elif seq == slot.seq and self.inflight[i]:
                    self._failed(slot, TIMEOUT)
            if open_loop:
                self._dispatch(now)
            else:
                while ready:
                    self._begin_closed(ready.popleft())
            if self._inflight_n == 0 and self._finished(now):
                return
            wake = now + LOOP_TICK_S
            if timers and timers[0][0] < wake:
                wake = timers[0][0]
            if open_loop and self._next < len(schedule) and start + schedule[self._next][1] < wake:
                wake = start + schedule[self._next][1]
            for fd, _ in ep.poll(max(0.0, wake - perf())):
                slot = self._by_fd.get(fd)
                if slot is None:
                    continue
                state = slot.state
                if state == RECEIVING:
                    self._readable(slot)
                elif state == CONNECTING:
                    self._connected(slot)
                elif state == SENDING:
                    self._send(slot)
                else:  # an idle keep-alive connection became readable: the server closed it
                    self._close(slot)

    def _finished(self, now: float) -> bool:
        if self._stop or now >= self.end_perf:
            return True
        if self.mode == "closed":
            return self._limit is not None and self._issued >= self._limit and not self._ready
        return self._next >= len(self._schedule) and not self._pending

    def _begin_closed(self, slot: _Slot) -> None:
        now = perf()
        if self._stop or now >= self.end_perf:
            return
        if self._limit is not None:
            if self._issued >= self._limit:
                return
            self._issued += 1
        self._start(slot, now, -1)

    def _dispatch(self, now: float) -> None:
        """Open loop: queue the arrivals that are due, and hand them to idle senders in order."""
        schedule, start, pending, idle = self._schedule, self.start_perf, self._pending, self._idle
        if self._stop or now > self.end_perf:
            pending.clear()  # not sent by the end: counted as dropped
            self._next = len(schedule)
            return
        while self._next < len(schedule) and start + schedule[self._next][1] <= now:
            index, offset = schedule[self._next]
            pending.append((index, start + offset))
            self._next += 1
        while pending and idle:
            index, intended = pending.popleft()
            self._start(idle.pop(), intended, index)

    def _start(self, slot: _Slot, intended: float, index: int) -> None:
        slot.intended, slot.index = intended, index
        slot.send = perf()
        slot.connect_s, slot.retried, slot.delay_s, slot.response = 0.0, False, -1.0, None
        slot.seq += 1
        heapq.heappush(self._timers, (slot.send + self.timeout_s, next(self._tie), slot.i, slot.seq))
        self.inflight[slot.i] = True
        self._inflight_n += 1
        slot.out = self.targets[slot.tgt].request
        if slot.sock is None:
            self._connect(slot)
        else:
            slot.reused = True
            self._send(slot)

    def _watch(self, slot: _Slot, mask: int) -> None:
        if slot.watched != mask:
            if slot.watched:
                self._ep.modify(slot.fd, mask)
            else:
                self._ep.register(slot.fd, mask)
            slot.watched = mask

    def _close(self, slot: _Slot) -> None:
        if slot.sock is not None:
            if slot.watched:
                try:
                    self._ep.unregister(slot.fd)
                except (OSError, ValueError):
                    pass
            self._by_fd.pop(slot.fd, None)
            try:
                slot.sock.close()
            except OSError:
                pass
        slot.sock, slot.fd, slot.watched = None, -1, 0

    def _connect(self, slot: _Slot) -> None:
        slot.reused = False
        slot.connect_t0 = perf()
        try:
            sock = _new_socket(False)
        except OSError as exc:
            return self._complete(slot, 0, b"", _os_error_code(exc), keep=False)
        slot.sock, slot.fd = sock, sock.fileno()
        self._by_fd[slot.fd] = slot
        code = sock.connect_ex(self.targets[slot.tgt].addr)
        if code == 0:
            slot.connect_s += perf() - slot.connect_t0
            return self._send(slot)
        if code in (errno.EINPROGRESS, errno.EAGAIN):
            slot.state = CONNECTING
            return self._watch(slot, select.EPOLLOUT)
        self._failed(slot, _errno_code(code))

    def _connected(self, slot: _Slot) -> None:
        code = slot.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if code:
            return self._failed(slot, _errno_code(code))
        try:
            slot.sock.getpeername()
        except OSError:  # a stale event for a reused fd number: the connect is still under way
            return
        slot.connect_s += perf() - slot.connect_t0
        self._send(slot)

    def _send(self, slot: _Slot) -> None:
        try:
            sent = slot.sock.send(slot.out)
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            return self._failed(slot, _os_error_code(exc))
        if sent < len(slot.out):  # the socket buffer is full: finish when it drains
            slot.out = slot.out[sent:]
            slot.state = SENDING
            return self._watch(slot, select.EPOLLOUT)
        slot.state = RECEIVING
        slot.response = Response()
        self._watch(slot, select.EPOLLIN)

    def _readable(self, slot: _Slot) -> None:
        try:
            data, ancillary, _, _ = slot.sock.recvmsg(65536, 64)
        except BlockingIOError:
            return
        except OSError as exc:
            return self._failed(slot, _os_error_code(exc))
        response = slot.response
        if not data:
            if response.eof():
                return self._complete(slot, response.status, response.head, OK, keep=False)
            return self._failed(slot, RESET)
        if not response.got:
            slot.delay_s = _arrival_delay_s(ancillary, time.time())
        try:
            complete = response.feed(data)
        except _Failure as failure:
            return self._failed(slot, failure.code)
        if complete:
            self._complete(slot, response.status, response.head, OK, response.keep)

    def _failed(self, slot: _Slot, code: int) -> None:
        """The attempt failed: retry once on a fresh connection if a reused one was closed, else record."""
        response = slot.response
        got_bytes = response is not None and response.got
        self._close(slot)
        if (slot.reused and not slot.retried and not got_bytes and code == RESET and not self._abandon
                and perf() - slot.send < RETRY_WINDOW_S):
            # The server had closed this idle connection as we reused it (its kernel answers at
            # once): try once afresh, as browsers do. A connection that dies later, mid-request,
            # is a real reset and is recorded as one.
            slot.retried = True
            self.retried[slot.i] += 1
            slot.response = None
            return self._connect(slot)
        self._complete(slot, response.status if response is not None else 0, b"", code, keep=False)

    def _complete(self, slot: _Slot, status: int, head: bytes, err: int, keep: bool) -> None:
        if err == OK and status >= 400:
            err = HTTP_5XX if status >= 500 else HTTP_4XX
        if not keep:
            self._close(slot)
        self._record(slot.i, slot.no, slot.tgt, slot.index, slot.intended, slot.send, slot.connect_s, status, err,
                     head, slot.delay_s)
        slot.seq += 1  # its timeout timer no longer applies
        slot.state, slot.response = IDLE, None
        self._inflight_n -= 1
        if self.mode == "open":
            self._idle.append(slot)
        elif err == REFUSED:
            if not self._gave_up_on_refusals():
                heapq.heappush(self._timers, (perf() + REFUSED_BACKOFF_S, next(self._tie), slot.i, -1))
        else:
            self._ready.append(slot)

    # -- results --
    def scheduled_before(self, cutoff_perf: float) -> int:
        """Open loop: how many arrivals were due before cutoff_perf."""
        limit = cutoff_perf - self.start_perf
        return sum(1 for _, off in self._schedule if off < limit)

    def results(self) -> dict:
        """Columns of plain lists plus the client's own statistics (everything picklable)."""
        rows = [row for rec in (self.snapshot if self.snapshot is not None else self.records) for row in rec]
        to_epoch = self.anchor_wall - self.anchor_perf
        cols = {name: [] for name in ("client_thread", "target", "index", "intended_s", "send_s", "end_s",
                                      "connect_ms", "status", "error", "server_app_ms", "server_cpu_ms",
                                      "server_io_ms", "worker_pid", "worker_thread", "handler_start_s",
                                      "handler_end_s")}
        delays = []
        for tno, tgt, index, intended, send, end, connect_s, status, err, head, delay_s in rows:
            if delay_s >= 0:
                delays.append(delay_s)
            cols["client_thread"].append(tno)
            cols["target"].append(tgt)
            cols["index"].append(index)
            cols["intended_s"].append(intended + to_epoch)
            cols["send_s"].append(send + to_epoch)
            cols["end_s"].append(end + to_epoch)
            cols["connect_ms"].append(connect_s * 1000.0)
            cols["status"].append(status)
            cols["error"].append(ERROR_NAMES[err])
            fields = parse_headers(head)
            for key in ("server_app_ms", "server_cpu_ms", "server_io_ms", "worker_pid", "worker_thread",
                        "handler_start_s", "handler_end_s"):
                cols[key].append(fields.get(key))
        dropped = 0
        if self.mode == "open" and self.start_perf is not None:
            cutoff = min(self.end_perf, self.stop_perf or math.inf, self.finished_perf or math.inf)
            dropped = max(0, self.scheduled_before(cutoff) - len(rows) - self.abandoned)
        stats = {"pid": os.getpid(), "connections": len(self.threads_spec), "cpu_s": self.cpu_s,
                 "wall_s": self.wall_s, "cpu_percent": 100.0 * self.cpu_s / self.wall_s if self.wall_s else None,
                 "retried": sum(self.retried), "abandoned": self.abandoned, "dropped": dropped,
                 "stop_reason": self.stop_reason, "loop_cpu_percent": self.loop_cpu_percent,
                 "loop_wait_percent": self.loop_wait_percent,
                 "start_s": None if self.start_perf is None else self.start_perf + to_epoch}
        delays.sort()
        for q in (50, 90, 99):
            stats[f"delay_p{q}_ms"] = _pct(delays, q / 100) * 1000.0 if delays else None
        return {"columns": cols, "stats": stats}


def _pct(sorted_values: list, q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def parse_headers(head: bytes) -> dict:
    """Server-Timing and X-Worker-*/X-Handler-* values from a response head (after the run)."""
    out = {}
    if not head:
        return out
    for line in head.split(b"\r\n")[1:]:
        name, sep, value = line.partition(b":")
        if not sep:
            continue
        name = name.strip().lower()
        if name == b"server-timing":
            for metric in value.decode("latin-1").split(","):
                parts = [p.strip() for p in metric.split(";")]
                key = {"app": "server_app_ms", "cpu": "server_cpu_ms", "io": "server_io_ms"}.get(parts[0])
                if key is None:
                    continue
                for param in parts[1:]:
                    if param.startswith("dur="):
                        try:
                            out[key] = float(param[4:])
                        except ValueError:
                            pass
        elif name in (b"x-worker-pid", b"x-worker-thread"):
            try:
                out["worker_pid" if name == b"x-worker-pid" else "worker_thread"] = int(value.strip())
            except ValueError:
                pass
        elif name in (b"x-handler-start", b"x-handler-end"):
            try:
                out["handler_start_s" if name == b"x-handler-start" else "handler_end_s"] = float(value.strip())
            except ValueError:
                pass
    return out


# ---- the child process --------------------------------------------------------------------

def _die_with_parent() -> None:
    try:
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _say(line: str, payload: bytes = b"") -> None:
    try:
        sys.stdout.buffer.write(line.encode() + b"\n" + payload)
        sys.stdout.buffer.flush()
    except (OSError, ValueError):
        os._exit(3)


def child_main() -> None:
    """Entry point of the client process: read the plan, run it, write the results."""
    import signal

    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides what an interrupt means
    parent = os.getppid()
    line = sys.stdin.readline()
    if not line:
        os._exit(3)
    plan = json.loads(line)
    engine = Engine(plan)
    engine.prepare()
    go = threading.Event()
    start_epoch = [None]

    def read_commands():
        while True:
            cmd = sys.stdin.readline()
            if not cmd:  # the parent is gone: nobody will read our results
                os._exit(3)
            cmd = cmd.strip()
            if cmd.startswith("go "):
                start_epoch[0] = float(cmd[3:])
                go.set()
            elif cmd == "stop":
                engine.stop("interrupted")
                go.set()

    threading.Thread(target=read_commands, daemon=True, name="commands").start()

    def watch_parent():
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(3)

    threading.Thread(target=watch_parent, daemon=True, name="parent-watch").start()
    _say(f"ready {os.getpid()}")
    if not go.wait(timeout=120) or start_epoch[0] is None:
        os._exit(4)
    engine.go(start_epoch[0])
    engine.wait(on_progress=lambda n: _say(f"progress {n}"))
    payload = pickle.dumps(engine.results(), protocol=pickle.HIGHEST_PROTOCOL)
    _say(f"result {len(payload)}", payload)  # over the pipe: no files to clean up if anyone dies
    _say("done")
    os._exit(0)  # threads abandoned in flight must not hold the process up


if __name__ == "__main__":
    child_main()
