// What both rings share: how a block of host memory is fenced after the copies made from it, the
// waits with a timeout (or none), the error a full ring gives, and the bound on their size.
//
// A fence is a host function queued on the copy's stream (cudaLaunchHostFunc): it runs once
// every copy queued before it has finished, and tells the ring, which then reuses the block.
// Nothing polls, and the worker processes waiting on a SharedRing are woken by the main
// process's own callback. The host function never calls the CUDA API (CUDA forbids it there).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>

namespace torchfeed {

// A full ring stayed full for the whole timeout (Python: TimeoutError).
struct RingTimeoutError : std::runtime_error {
  explicit RingTimeoutError(const std::string& what);
};

// When a wait ends: timeout_s seconds from now, or never (timeout_s < 0, Python's None). NaN,
// infinity and 0 are refused (std::invalid_argument naming `who`).
class Deadline {
 public:
  using Clock = std::chrono::steady_clock;
  Deadline(const char* who, double timeout_s);
  bool forever() const { return forever_; }
  bool passed() const { return !forever_ && Clock::now() >= at_; }
  // The next time to wake up: the deadline, or `slice` from now when waiting forever (so that a
  // waiter still looks around now and then, e.g. for dead workers).
  Clock::time_point next_wake(std::chrono::milliseconds slice) const;
  // The same as seconds and nanoseconds of CLOCK_MONOTONIC (for pthread_cond_timedwait).
  void next_wake_monotonic(std::chrono::milliseconds slice, int64_t* sec, int64_t* nsec) const;
  double seconds() const { return seconds_; }
  std::string describe() const;  // "after 1.5 s"

 private:
  bool forever_;
  double seconds_;
  Clock::time_point at_;
};

// Runs `done` on a CUDA driver thread once every piece of work queued on `stream` (a
// cudaStream_t as an integer, of `device`) before this call has finished. `done` must not call
// the CUDA API. Throws std::invalid_argument in a build without CUDA.
void after_stream_work(const char* who, int64_t stream, int64_t device, std::function<void()> done);

// Test hooks (torchfeed._C._testing): with manual fences on, after_stream_work holds each fence,
// whatever its stream, until complete_manual_fences() runs them all (returning how many).
void set_manual_fences(bool on);
int64_t complete_manual_fences();
int64_t pending_manual_fences();

// This machine's physical memory in bytes (0 when the system does not say): the bound
// check_arena enforces, and the one the zero-copy loader sizes its default ring against.
int64_t physical_memory();

// The arguments of a ring's arena, checked once for both rings (std::invalid_argument naming
// `who`): capacity > 0 bytes and within the machine's physical memory, alignment a power of two
// in [1, 4096].
void check_arena(const char* who, int64_t capacity, int64_t alignment);

}  // namespace torchfeed
