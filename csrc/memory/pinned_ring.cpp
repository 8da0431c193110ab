#include "memory/pinned_ring.h"

#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <sstream>
#include <stdexcept>
#include <thread>

#ifdef TORCHFEED_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace torchfeed {

RingTimeoutError::RingTimeoutError(const std::string& what) : std::runtime_error(what) {}

namespace {

using Clock = std::chrono::steady_clock;

#ifdef TORCHFEED_WITH_CUDA
bool gpu_usable() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string("PinnedRing: ") + what + " failed: " +
                             cudaGetErrorString(err));
  }
}
#endif

// Whether every event has fired. An event in an error state counts as fired: the copy it
// guarded is over, one way or the other, and the error surfaces on the stream's next sync.
bool events_done(const std::vector<void*>& events) {
#ifdef TORCHFEED_WITH_CUDA
  for (void* e : events) {
    const cudaError_t err = cudaEventQuery(static_cast<cudaEvent_t>(e));
    if (err == cudaErrorNotReady) return false;
    if (err != cudaSuccess) (void)cudaGetLastError();
  }
#else
  (void)events;
#endif
  return true;
}

}  // namespace

std::shared_ptr<PinnedRing> PinnedRing::create(int64_t capacity, int64_t alignment, int pinned,
                                               bool lock_memory) {
  if (capacity <= 0) {
    throw std::invalid_argument("PinnedRing: capacity must be > 0 bytes, got " +
                                std::to_string(capacity));
  }
  if (alignment <= 0 || (alignment & (alignment - 1)) != 0 || alignment > 4096) {
    throw std::invalid_argument("PinnedRing: alignment must be a power of two in [1, 4096], got " +
                                std::to_string(alignment));
  }
  bool use_pinned = false;
#ifdef TORCHFEED_WITH_CUDA
  use_pinned = pinned == 1 || (pinned == -1 && gpu_usable());
  if (pinned == 1 && !gpu_usable()) {
    throw std::invalid_argument(
        "PinnedRing: pinned=True needs a usable CUDA GPU, and none is (pinned=None picks "
        "page-locked memory when one is)");
  }
#else
  if (pinned == 1) {
    throw std::invalid_argument(
        "PinnedRing: pinned=True needs torchfeed built with CUDA; this build has no CUDA "
        "kernels (torchfeed.build_info())");
  }
#endif
  return std::shared_ptr<PinnedRing>(new PinnedRing(capacity, alignment, use_pinned, lock_memory));
}

PinnedRing::PinnedRing(int64_t capacity, int64_t alignment, bool pinned, bool lock_memory)
    : capacity_(capacity), alignment_(alignment), pinned_(pinned) {
  if (pinned_) {
#ifdef TORCHFEED_WITH_CUDA
    void* p = nullptr;
    check_cuda(cudaHostAlloc(&p, static_cast<size_t>(capacity_), cudaHostAllocDefault),
               "cudaHostAlloc");
    base_ = static_cast<uint8_t*>(p);
#endif
  } else {
    void* p = nullptr;
    const long page = sysconf(_SC_PAGESIZE);
    if (posix_memalign(&p, static_cast<size_t>(page > 0 ? page : 4096),
                       static_cast<size_t>(capacity_)) != 0) {
      throw std::runtime_error("PinnedRing: cannot allocate " + std::to_string(capacity_) +
                               " bytes of host memory");
    }
    base_ = static_cast<uint8_t*>(p);
    if (lock_memory) {
      if (mlock(base_, static_cast<size_t>(capacity_)) != 0) {
        std::free(base_);
        base_ = nullptr;
        throw std::runtime_error(
            "PinnedRing: mlock of " + std::to_string(capacity_) +
            " bytes failed (is RLIMIT_MEMLOCK, `ulimit -l`, large enough?); use mlock=False");
      }
      locked_ = true;
    }
  }
  stats_.capacity = capacity_;
  stats_.pinned = pinned_;
}

PinnedRing::~PinnedRing() {
  std::lock_guard<std::mutex> lock(mu_);
#ifdef TORCHFEED_WITH_CUDA
  // A copy may still be reading the arena: wait for it before the memory goes back.
  for (Block& b : blocks_) {
    for (void* e : b.events) {
      (void)cudaEventSynchronize(static_cast<cudaEvent_t>(e));
      (void)cudaEventDestroy(static_cast<cudaEvent_t>(e));
    }
  }
  for (auto& [device, pool] : event_pool_) {
    for (void* e : pool) (void)cudaEventDestroy(static_cast<cudaEvent_t>(e));
  }
#endif
  free_arena_locked();
}

void PinnedRing::free_arena_locked() {
  if (base_ == nullptr) return;
  if (pinned_) {
#ifdef TORCHFEED_WITH_CUDA
    (void)cudaFreeHost(base_);
#endif
  } else {
    if (locked_) munlock(base_, static_cast<size_t>(capacity_));
    std::free(base_);
  }
  base_ = nullptr;
}

int64_t PinnedRing::in_use_locked() const {
  int64_t n = 0;
  for (const Block& b : blocks_) n += b.size;
  return n;
}

void PinnedRing::reclaim_locked() {
  while (!blocks_.empty()) {
    Block& front = blocks_.front();
    if (front.host_held || !events_done(front.events)) break;
    for (void* e : front.events) {
      event_pool_[front.event_device].push_back(e);
    }
    blocks_.pop_front();
  }
}

bool PinnedRing::fits_locked(int64_t size, int64_t* offset) {
  if (blocks_.empty()) {
    *offset = 0;
    return size <= capacity_;
  }
  const int64_t tail = blocks_.front().offset;
  const int64_t head = blocks_.back().offset + blocks_.back().size;
  const bool wrapped = blocks_.back().offset < tail;
  if (!wrapped) {
    if (capacity_ - head >= size) {
      *offset = head;
      return true;
    }
    if (tail >= size) {  // wrap around; [head, capacity) stays unused until the tail passes it
      *offset = 0;
      return true;
    }
    return false;
  }
  if (tail - head >= size) {
    *offset = head;
    return true;
  }
  return false;
}

std::string PinnedRing::describe_locked(int64_t request) const {
  std::ostringstream s;
  s << "capacity " << capacity_ << " bytes, " << in_use_locked() << " bytes in flight in "
    << blocks_.size() << " block(s), request " << request << " bytes";
  if (!blocks_.empty()) {
    const Block& f = blocks_.front();
    s << "; the oldest block (" << f.size << " bytes) is "
      << (f.host_held ? "still held by its consumer (a tensor viewing it is alive)"
                      : "waiting for its host-to-device copy to finish");
  }
  return s.str();
}

at::Tensor PinnedRing::allocate(int64_t nbytes, double timeout_s) {
  if (nbytes < 0) {
    throw std::invalid_argument("PinnedRing.allocate: nbytes must be >= 0, got " +
                                std::to_string(nbytes));
  }
  if (nbytes == 0) {
    // Nothing to hold: a zero-size block would sit at the tail with the offset of the oldest
    // block and make a wrapped ring look unwrapped.
    return at::empty({0}, at::TensorOptions().dtype(at::kByte));
  }
  const int64_t size = (nbytes + alignment_ - 1) / alignment_ * alignment_;
  if (size > capacity_) {
    throw std::invalid_argument("PinnedRing.allocate: a request of " + std::to_string(nbytes) +
                                " bytes is larger than the ring's capacity of " +
                                std::to_string(capacity_) + " bytes");
  }
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(timeout_s));
  std::unique_lock<std::mutex> lock(mu_);
  bool waited = false;
  int64_t offset = 0;
  for (;;) {
    if (closed_) throw std::runtime_error("PinnedRing.allocate: the ring is closed");
    reclaim_locked();
    if (fits_locked(size, &offset)) break;
    waited = true;
    if (Clock::now() >= deadline) {
      throw RingTimeoutError("PinnedRing.allocate: timed out after " +
                             std::to_string(timeout_s) + " s waiting for space: " +
                             describe_locked(nbytes));
    }
    if (blocks_.front().host_held) {
      released_.wait_until(lock, deadline);
    } else {
      // Waiting on the oldest block's copy: poll its events without holding the lock.
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      lock.lock();
    }
  }
  if (waited) {
    stats_.waits += 1;
    stats_.wait_seconds += std::chrono::duration<double>(Clock::now() - start).count();
  }
  Block block;
  block.id = next_id_++;
  block.offset = offset;
  block.size = size;
  blocks_.push_back(block);
  stats_.allocations += 1;
  stats_.high_water = std::max(stats_.high_water, in_use_locked());

  std::weak_ptr<PinnedRing> ring = weak_from_this();
  std::shared_ptr<PinnedRing> keep = shared_from_this();
  const int64_t id = block.id;
  // The storage holds the ring alive (the arena cannot be freed under a view) and releases the
  // block when the last view of it is freed: the consumer's side of the fence.
  return at::from_blob(
      base_ + offset, {nbytes},
      [keep, id](void*) { keep->host_release(id); },
      at::TensorOptions().dtype(at::kByte).device(at::kCPU));
}

void PinnedRing::host_release(int64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  for (Block& b : blocks_) {
    if (b.id == id) {
      b.host_held = false;
      break;
    }
  }
  if (closed_) {
    reclaim_locked();
    if (blocks_.empty()) free_arena_locked();
  }
  released_.notify_all();
}

void PinnedRing::record(const at::Tensor& view, int64_t stream, int64_t device) {
#ifdef TORCHFEED_WITH_CUDA
  std::lock_guard<std::mutex> lock(mu_);
  const auto* p = static_cast<const uint8_t*>(view.data_ptr());
  const int64_t offset = p - base_;
  for (Block& b : blocks_) {
    if (offset >= b.offset && offset < b.offset + b.size) {
      if (!b.events.empty() && b.event_device != device) {
        throw std::invalid_argument("PinnedRing.record: a block's copies must all go to one device");
      }
      b.event_device = device;
      std::vector<void*>& pool = event_pool_[device];
      cudaEvent_t e;
      if (!pool.empty()) {
        e = static_cast<cudaEvent_t>(pool.back());
        pool.pop_back();
      } else {
        int current = 0;
        check_cuda(cudaGetDevice(&current), "cudaGetDevice");
        check_cuda(cudaSetDevice(static_cast<int>(device)), "cudaSetDevice");
        const cudaError_t err = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
        (void)cudaSetDevice(current);
        check_cuda(err, "cudaEventCreate");
      }
      check_cuda(cudaEventRecord(e, reinterpret_cast<cudaStream_t>(stream)), "cudaEventRecord");
      b.events.push_back(e);
      return;
    }
  }
  throw std::invalid_argument("PinnedRing.record: the tensor does not view a live block of this ring");
#else
  (void)view;
  (void)stream;
  (void)device;
  throw std::invalid_argument(
      "PinnedRing.record: this build of torchfeed has no CUDA support; there is no copy to fence");
#endif
}

void PinnedRing::close(double timeout_s) {
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(timeout_s));
  std::unique_lock<std::mutex> lock(mu_);
  closed_ = true;
  for (;;) {
    bool pending = false;
    for (const Block& b : blocks_) pending = pending || !events_done(b.events);
    if (!pending) break;
    if (Clock::now() >= deadline) {
      throw RingTimeoutError("PinnedRing.close: copies from the ring are still in flight after " +
                             std::to_string(timeout_s) + " s");
    }
    lock.unlock();
    std::this_thread::sleep_for(std::chrono::microseconds(100));
    lock.lock();
  }
  reclaim_locked();
  // Views still alive keep the arena (they hold the ring); it goes when the last one does.
  if (blocks_.empty()) free_arena_locked();
}

bool PinnedRing::closed() {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_;
}

RingStats PinnedRing::stats() {
  std::lock_guard<std::mutex> lock(mu_);
  reclaim_locked();
  RingStats s = stats_;
  s.bytes_in_use = in_use_locked();
  s.blocks_in_flight = static_cast<int64_t>(blocks_.size());
  return s;
}

std::vector<RingBlockInfo> PinnedRing::blocks() {
  std::lock_guard<std::mutex> lock(mu_);
  reclaim_locked();
  std::vector<RingBlockInfo> out;
  for (const Block& b : blocks_) {
    int64_t pending = 0;
#ifdef TORCHFEED_WITH_CUDA
    for (void* e : b.events) pending += cudaEventQuery(static_cast<cudaEvent_t>(e)) == cudaErrorNotReady;
#endif
    out.push_back(RingBlockInfo{b.id, b.offset, b.size, b.host_held, pending});
  }
  return out;
}

}  // namespace torchfeed
