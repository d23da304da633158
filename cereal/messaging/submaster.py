"""SubMaster: subscribe to several services and judge each one alive, on time and valid.

The rules are openpilot's, exactly (openpilot's cereal/messaging SubMaster):
- Every socket is conflated; `poll` names the one service the update waits on (None: wait on all), the
  others get a non-blocking receive per update. `frequency` (only without `poll`) overrides the update rate,
  which is otherwise the highest rate among the polled services.
- `frame` counts update() calls; recv_frame[s] is the frame that last received s.
- alive[s] = now - recv_time[s] < 10 / Hz (or seen and SIMULATION=1); freq_ok[s] = FrequencyTracker.valid
  (or SIMULATION=1); valid[s] = the last message's own `valid`. On-demand services (Hz <= 1e-5) start with
  all three True and never have alive/freq_ok recomputed; all other services start with all three False.
- all_alive skips ignore_alive; all_freq_ok checks only services above 0.99 Hz that are in neither
  ignore_avg_freq nor ignore_alive; all_valid skips ignore_valid; all_checks = all three.
Additions: a malformed message is counted in malformed[s], its error kept in decode_error[s], and skipped;
invalid_reason(s) says why the last message was not valid; the clock is injectable.
"""
import time

from cereal.env import CEREAL_ENV
from cereal.messaging.decode import log_from_bytes
from cereal.messaging.errors import MessageDecodeError
from cereal.messaging.frequency import FrequencyTracker
from cereal.messaging.message import new_message, service_info
from cereal.messaging.sockets import Poller, sub_sock

ON_DEMAND_HZ = 1e-5


class SubMaster:
  def __init__(self, services, poll: str | None = None, ignore_alive=None, ignore_avg_freq=None,
               ignore_valid=None, addr: str = "127.0.0.1", frequency: float | None = None, clock=time.monotonic):
    self.services = list(dict.fromkeys(services))
    info = {s: service_info(s) for s in self.services}
    if poll is not None and (not isinstance(poll, str) or poll not in info):
      raise ValueError(f"poll={poll!r} must be one of the subscribed services {self.services}")
    if frequency is not None and poll is not None:
      raise ValueError(f"frequency={frequency!r} is only allowed without poll (poll={poll!r})")
    if frequency is not None and not frequency > 0:
      raise ValueError(f"frequency={frequency!r} must be a positive rate in Hz")
    self.ignore_alive = self._subset("ignore_alive", ignore_alive)
    self.ignore_avg_freq = self._subset("ignore_avg_freq", ignore_avg_freq)
    self.ignore_valid = self._subset("ignore_valid", ignore_valid)
    self.clock = clock
    self.simulation = CEREAL_ENV.flag("SIMULATION")

    polled = [poll] if poll is not None else self.services
    self.non_polled_services = [s for s in self.services if s not in polled]
    self.update_freq = frequency or max((info[s].frequency for s in polled), default=0.)
    self.static_freq_services = [s for s in self.services if info[s].frequency > ON_DEMAND_HZ]
    self._hz = {s: info[s].frequency for s in self.services}

    self.frame = -1
    self.seen = dict.fromkeys(self.services, False)
    self.updated = dict.fromkeys(self.services, False)
    self.recv_time = dict.fromkeys(self.services, 0.)
    self.recv_frame = dict.fromkeys(self.services, 0)
    self.logMonoTime = dict.fromkeys(self.services, 0)
    on_demand = {s: s not in self.static_freq_services for s in self.services}
    self.alive = dict(on_demand)
    self.freq_ok = dict(on_demand)
    self.valid = dict(on_demand)
    self._invalid_reason = dict.fromkeys(self.services, "")
    self.malformed = dict.fromkeys(self.services, 0)
    self.decode_error: dict[str, MessageDecodeError | None] = dict.fromkeys(self.services, None)
    self.freq_tracker = {s: FrequencyTracker(info[s].frequency, self.update_freq, s == poll) for s in self.services}
    self.data = {s: getattr(new_message(s).as_reader(), s) for s in self.services}

    self.poller = Poller()
    self.sock = {}
    self._service_of = {}
    for s in self.services:
      sock = sub_sock(s, poller=self.poller if s in polled else None, addr=addr, conflate=True)
      self.sock[s] = sock
      self._service_of[id(sock)] = s

  def _subset(self, what: str, names) -> list:
    names = list(names or [])
    for n in names:
      service_info(n)
      if n not in self.services:
        raise ValueError(f"{what} names {n!r}, which is not among the subscribed services {self.services}")
    return names

  def __getitem__(self, s: str):
    return self.data[s]

  def _receive(self, s: str):
    dat = self.sock[s].receive(non_blocking=True)
    if dat is None:
      return None
    try:
      return log_from_bytes(dat, service=s)
    except MessageDecodeError as e:
      self.malformed[s] += 1
      self.decode_error[s] = e
      return None

  def update(self, timeout: int = 100) -> None:
    """Wait up to timeout ms for a polled service, receive what is there, and re-judge every service."""
    msgs = [self._receive(self._service_of[id(sock)]) for sock in self.poller.poll(timeout)]
    msgs += [self._receive(s) for s in self.non_polled_services]
    self.update_msgs(self.clock(), msgs)

  def update_msgs(self, cur_time: float, msgs) -> None:
    """Apply decoded Events (None entries are skipped) received at cur_time (seconds, the SubMaster clock)."""
    self.frame += 1
    self.updated = dict.fromkeys(self.services, False)
    for msg in msgs:
      if msg is None:
        continue
      s = msg.which()
      if s not in self.seen:
        raise ValueError(f"message of service {s!r} given to a SubMaster of {self.services}")
      self.seen[s] = True
      self.updated[s] = True
      self.freq_tracker[s].record_recv_time(cur_time)
      self.recv_time[s] = cur_time
      self.recv_frame[s] = self.frame
      self.data[s] = getattr(msg, s)
      self.logMonoTime[s] = msg.logMonoTime
      self.valid[s] = msg.valid
      self._invalid_reason[s] = "" if msg.valid else msg.invalidReason

    for s in self.static_freq_services:
      self.alive[s] = (cur_time - self.recv_time[s]) < (10. / self._hz[s]) or (self.seen[s] and self.simulation)
      self.freq_ok[s] = self.freq_tracker[s].valid or self.simulation

  def close(self) -> None:
    """Give up the reader slots (a process exiting frees them anyway)."""
    for sock in self.sock.values():
      sock.close()

  def invalid_reason(self, s: str) -> str:
    """The publisher's invalidReason of the last message of s ("" if it was valid or none came yet)."""
    return self._invalid_reason[s]

  def _names(self, service_list) -> list:
    return self.services if service_list is None else list(service_list)

  def all_alive(self, service_list=None) -> bool:
    return all(self.alive[s] for s in self._names(service_list) if s not in self.ignore_alive)

  def _check_avg_freq(self, s: str) -> bool:
    """Whether all_freq_ok() judges s (openpilot's name: tools and tests call it)."""
    return self._hz[s] > 0.99 and s not in self.ignore_avg_freq and s not in self.ignore_alive

  def all_freq_ok(self, service_list=None) -> bool:
    return all(self.freq_ok[s] for s in self._names(service_list) if self._check_avg_freq(s))

  def all_valid(self, service_list=None) -> bool:
    return all(self.valid[s] for s in self._names(service_list) if s not in self.ignore_valid)

  def all_checks(self, service_list=None) -> bool:
    return self.all_alive(service_list) and self.all_freq_ok(service_list) and self.all_valid(service_list)

  def failures(self, service_list=None) -> list[str]:
    """Why all_checks() is False, one line per failing check, e.g. "modelV2: not alive" (empty when it passes)."""
    out = []
    for s in self._names(service_list):
      if s not in self.ignore_alive and not self.alive[s]:
        out.append(f"{s}: not alive" if self.seen[s] else f"{s}: never received")
      if self._check_avg_freq(s) and not self.freq_ok[s]:
        out.append(f"{s}: frequency out of range")
      if s not in self.ignore_valid and not self.valid[s]:
        reason = self._invalid_reason[s] if self.seen[s] else "no message yet"
        out.append(f"{s}: invalid ({reason})" if reason else f"{s}: invalid")
    return out
