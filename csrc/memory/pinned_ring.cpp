#include "memory/pinned_ring.h"

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <unordered_set>

#ifdef TORCHFEED_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace torchfeed {

namespace {

using Clock = std::chrono::steady_clock;
constexpr std::chrono::milliseconds kWakeSlice{100};

#ifdef TORCHFEED_WITH_CUDA
bool gpu_usable() {
  int count = 0;
  const bool ok = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  if (!ok) (void)cudaGetLastError();
  return ok;
}

void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    throw std::runtime_error(std::string("PinnedRing: ") + what +
                             " failed: " + cudaGetErrorString(err));
  }
}
#endif

// RLIMIT_MEMLOCK as text for messages: "N bytes" or "no limit".
std::string memlock_limit_text() {
  rlimit limit{};
  if (getrlimit(RLIMIT_MEMLOCK, &limit) != 0) return "unknown";
  if (limit.rlim_cur == RLIM_INFINITY) return "no limit";
  return std::to_string(limit.rlim_cur) + " bytes";
}

// Whether this process may lock memory beyond RLIMIT_MEMLOCK (CAP_IPC_LOCK, bit 14 of the
// effective set). Unknown (no /proc) counts as yes: mlock() itself then says if it cannot.
bool may_lock_beyond_limit() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("CapEff:", 0) == 0) {
      const uint64_t caps = std::strtoull(line.c_str() + 7, nullptr, 16);
      return (caps >> 14) & 1U;
    }
  }
  return true;
}

void check_memlock_limit(int64_t capacity) {
  rlimit limit{};
  if (getrlimit(RLIMIT_MEMLOCK, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY ||
      may_lock_beyond_limit()) {
    return;
  }
  if (static_cast<uint64_t>(capacity) > static_cast<uint64_t>(limit.rlim_cur)) {
    throw std::invalid_argument("PinnedRing: mlock=True needs " + std::to_string(capacity) +
                                " bytes of locked memory but RLIMIT_MEMLOCK (`ulimit -l`) allows " +
                                std::to_string(limit.rlim_cur) +
                                " bytes; raise the limit or use mlock=False");
  }
}

}  // namespace

std::shared_ptr<PinnedRing> PinnedRing::create(int64_t capacity, int64_t alignment, int pinned,
                                               bool lock_memory) {
  check_arena("PinnedRing", capacity, alignment);
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
  if (lock_memory && !use_pinned) check_memlock_limit(capacity);
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
    locked_ = true;  // page-locked by the CUDA runtime
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
        const int err = errno;
        std::free(base_);
        base_ = nullptr;
        throw std::runtime_error("PinnedRing: mlock of " + std::to_string(capacity_) +
                                 " bytes failed (" + std::strerror(err) +
                                 "); RLIMIT_MEMLOCK (`ulimit -l`) allows " + memlock_limit_text() +
                                 " without CAP_IPC_LOCK; raise the limit or use mlock=False");
      }
      locked_ = true;
    }
  }
  stats_.capacity = capacity_;
  stats_.pinned = pinned_;
  stats_.locked = locked_;
}

PinnedRing::~PinnedRing() {
  // Every pending copy's fence holds a reference to the ring: none is pending here.
  std::lock_guard<std::mutex> lock(mu_);
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
    const Block& front = blocks_.front();
    if (front.host_held || front.pending_copies > 0) break;
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
  // Before any arithmetic on it: a request near the int64 limit would overflow the rounding.
  if (nbytes > capacity_) {
    throw std::invalid_argument("PinnedRing.allocate: a request of " + std::to_string(nbytes) +
                                " bytes is larger than the ring's capacity of " +
                                std::to_string(capacity_) + " bytes");
  }
  const Deadline deadline("PinnedRing.allocate", timeout_s);
  if (nbytes == 0) {
    // Nothing to hold: a zero-size block would sit at the tail with the offset of the oldest
    // block and make a wrapped ring look unwrapped.
    return at::empty({0}, at::TensorOptions().dtype(at::kByte));
  }
  const int64_t size = std::min(capacity_, (nbytes + alignment_ - 1) / alignment_ * alignment_);
  const auto start = Clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  bool waited = false;
  int64_t offset = 0;
  for (;;) {
    if (closed_) throw std::runtime_error("PinnedRing.allocate: the ring is closed");
    reclaim_locked();
    if (fits_locked(size, &offset)) break;
    waited = true;
    if (deadline.passed()) {
      throw RingTimeoutError("PinnedRing.allocate: timed out " + deadline.describe() +
                             " waiting for space: " + describe_locked(nbytes));
    }
    released_.wait_until(lock, deadline.next_wake(kWakeSlice));
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

  std::shared_ptr<PinnedRing> keep = shared_from_this();
  const int64_t id = block.id;
  // The storage holds the ring alive (the arena cannot be freed under a view) and releases the
  // block when the last view of it is freed: the consumer's side of the fence.
  return at::from_blob(
      base_ + offset, {nbytes}, [keep, id](void*) { keep->host_release(id); },
      at::TensorOptions().dtype(at::kByte).device(at::kCPU));
}

PinnedRing::Block* PinnedRing::find_locked(int64_t id) {
  for (Block& b : blocks_) {
    if (b.id == id) return &b;
  }
  return nullptr;
}

void PinnedRing::host_release(int64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (Block* b = find_locked(id)) b->host_held = false;
  reclaim_locked();
  if (closed_ && blocks_.empty()) free_arena_locked();
  released_.notify_all();
}

void PinnedRing::copies_done(int64_t id) {  // on a CUDA driver thread: no CUDA calls here
  std::lock_guard<std::mutex> lock(mu_);
  if (Block* b = find_locked(id)) b->pending_copies -= 1;
  reclaim_locked();
  if (closed_ && blocks_.empty()) free_arena_locked();
  released_.notify_all();
}

int64_t PinnedRing::record_many(const std::vector<at::Tensor>& views, int64_t stream,
                                int64_t device) {
  std::vector<int64_t> ids;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::unordered_set<int64_t> seen;
    for (const at::Tensor& view : views) {
      const int64_t offset = reinterpret_cast<int64_t>(view.data_ptr()) - data_address();
      const Block* found = nullptr;
      for (const Block& b : blocks_) {
        if (offset >= b.offset && offset < b.offset + b.size) found = &b;
      }
      if (found == nullptr) {
        throw std::invalid_argument(
            "PinnedRing.record_many: a tensor does not view a live block of this ring");
      }
      if (seen.insert(found->id).second) ids.push_back(found->id);
    }
    for (int64_t id : ids) find_locked(id)->pending_copies += 1;
  }
  std::shared_ptr<PinnedRing> keep = shared_from_this();
  for (size_t i = 0; i < ids.size(); ++i) {
    const int64_t id = ids[i];
    try {
      after_stream_work("PinnedRing.record_many", stream, device,
                        [keep, id] { keep->copies_done(id); });
    } catch (...) {
      for (size_t j = i; j < ids.size(); ++j) copies_done(ids[j]);  // nothing will fire
      throw;
    }
  }
  return static_cast<int64_t>(ids.size());
}

int64_t PinnedRing::block_of(const void* p) {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t offset = reinterpret_cast<int64_t>(p) - data_address();
  for (const Block& b : blocks_) {
    if (offset >= b.offset && offset < b.offset + b.size) return b.id;
  }
  throw std::invalid_argument("PinnedRing: the tensor does not view a live block of this ring");
}

int64_t PinnedRing::stage_and_copy(const std::vector<at::Tensor>& sources,
                                   const std::vector<int64_t>& offsets, const at::Tensor& block,
                                   const at::Tensor& target, int64_t stream, int64_t chunk_bytes) {
  constexpr const char* who = "PinnedRing.stage_and_copy";
  TORCH_CHECK_VALUE(sources.size() == offsets.size(), who, ": ", sources.size(), " sources but ",
                    offsets.size(), " offsets");
  TORCH_CHECK_VALUE(block.scalar_type() == at::kByte && block.dim() == 1 && block.is_contiguous(),
                    who, ": block must be a 1-D uint8 tensor from allocate()");
  TORCH_CHECK_VALUE(chunk_bytes >= 1, who, ": chunk_bytes must be >= 1, got ", chunk_bytes);
  const int64_t total = block.numel();
  TORCH_CHECK_VALUE(
      target.scalar_type() == at::kByte && target.is_contiguous() && target.numel() == total, who,
      ": target must be a contiguous uint8 tensor of ", total, " bytes");
  const bool to_gpu = target.is_cuda();
  TORCH_CHECK_VALUE(to_gpu || target.device().is_cpu(), who,
                    ": target must be on a CUDA device (or the CPU), got ", target.device());
#ifndef TORCHFEED_WITH_CUDA
  TORCH_CHECK_VALUE(!to_gpu, who, ": this build of torchfeed has no CUDA support");
#endif
  uint8_t* host = block.data_ptr<uint8_t>();
  const int64_t id = total > 0 ? block_of(host) : -1;
  struct Field {
    int64_t offset, size;
    const uint8_t* src;
  };
  std::vector<Field> fields;
  for (size_t i = 0; i < sources.size(); ++i) {
    const at::Tensor& src = sources[i];
    const int64_t size = src.numel() * src.element_size();
    TORCH_CHECK_VALUE(src.device().is_cpu(), who, ": sources[", i, "] must be a CPU tensor");
    TORCH_CHECK_VALUE(offsets[i] >= 0 && offsets[i] <= total && size <= total - offsets[i], who,
                      ": sources[", i, "] (", size, " bytes at ", offsets[i],
                      ") does not fit the block of ", total, " bytes");
    if (src.is_contiguous()) {
      fields.push_back(Field{offsets[i], size, static_cast<const uint8_t*>(src.data_ptr())});
    } else {  // strided: staged whole, first (torch's copy does the gathering)
      at::from_blob(host + offsets[i], src.sizes(), src.options()).copy_(src);
    }
  }
  std::sort(fields.begin(), fields.end(),
            [](const Field& a, const Field& b) { return a.offset < b.offset; });
  const int64_t chunks = (total + chunk_bytes - 1) / chunk_bytes;
  for (int64_t k = 0; k < chunks; ++k) {
    const int64_t lo = k * chunk_bytes, hi = std::min(total, lo + chunk_bytes);
    const int64_t grain = std::max<int64_t>(int64_t{256} << 10, (hi - lo) / at::get_num_threads());
    at::parallel_for(lo, hi, grain, [&](int64_t begin, int64_t end) {
      for (const Field& f : fields) {
        const int64_t a = std::max(begin, f.offset), b = std::min(end, f.offset + f.size);
        if (a < b) std::memcpy(host + a, f.src + (a - f.offset), static_cast<size_t>(b - a));
      }
    });
    if (to_gpu) {
#ifdef TORCHFEED_WITH_CUDA
      const cudaError_t err = cudaMemcpyAsync(
          static_cast<uint8_t*>(target.data_ptr()) + lo, host + lo, static_cast<size_t>(hi - lo),
          cudaMemcpyHostToDevice, reinterpret_cast<cudaStream_t>(stream));
      if (err != cudaSuccess) {
        (void)cudaGetLastError();
        // chunks already queued read the block: fence what was queued before failing
        if (k > 0) record_many({block}, stream, target.device().index());
        TORCH_CHECK(false, who, ": cudaMemcpyAsync failed: ", cudaGetErrorString(err));
      }
#endif
    } else {
      std::memcpy(static_cast<uint8_t*>(target.data_ptr()) + lo, host + lo,
                  static_cast<size_t>(hi - lo));
    }
  }
  if (to_gpu && id >= 0) record_many({block}, stream, target.device().index());
  return chunks;
}

void PinnedRing::close(double timeout_s) {
  const Deadline deadline("PinnedRing.close", timeout_s);
  std::unique_lock<std::mutex> lock(mu_);
  closed_ = true;
  for (;;) {
    bool pending = false;
    for (const Block& b : blocks_) pending = pending || b.pending_copies > 0;
    if (!pending) break;
    if (deadline.passed()) {
      throw RingTimeoutError("PinnedRing.close: copies from the ring are still in flight " +
                             deadline.describe());
    }
    released_.wait_until(lock, deadline.next_wake(kWakeSlice));
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
    out.push_back(RingBlockInfo{b.id, b.offset, b.size, b.host_held, b.pending_copies});
  }
  return out;
}

}  // namespace torchfeed
