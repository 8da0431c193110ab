#include "memory/shared_ring.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <ctime>
#include <limits>
#include <stdexcept>
#include <utility>

#ifdef TORCHFEED_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace torchfeed {
namespace {

constexpr uint64_t kMagic = 0x74666565645f7231ULL;  // "tfeed_r1"
constexpr int32_t kFree = 0;
constexpr int32_t kWorker = 1;
constexpr int32_t kConsumer = 2;

int64_t align_up(int64_t n, int64_t a) { return (n + a - 1) / a * a; }

void check(int rc, const char* what) {
  if (rc != 0) throw std::runtime_error(std::string("SharedRing: ") + what + " failed");
}

// The mapping's size for a data area of `capacity` bytes.
int64_t mapping_size(int64_t capacity) {
  return align_up(static_cast<int64_t>(sizeof(SharedControl)), 4096) + capacity;
}

}  // namespace

// Only "no such process" means dead: a sandbox that refuses the probe otherwise (EPERM, or a
// seccomp filter's own errno) must not have the regions of live workers reclaimed under them.
bool process_alive(int32_t pid) { return pid > 0 && (kill(pid, 0) == 0 || errno != ESRCH); }

SharedRing::SharedRing(int64_t base, int64_t size)
    : base_(base), size_(size), control_(reinterpret_cast<SharedControl*>(base)) {}

namespace {
int64_t map_fd(int fd, int64_t size) {
  // Not MAP_POPULATE: that would allocate the whole capacity at once. Pages are allocated as
  // they are first touched; first fit keeps regions low, so a ring touches no more than its
  // high-water mark, and populate() makes the expected part resident up front.
  void* p = mmap(nullptr, static_cast<size_t>(size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    throw std::runtime_error("SharedRing: mmap of " + std::to_string(size) + " bytes failed");
  }
  return reinterpret_cast<int64_t>(p);
}
}  // namespace

std::shared_ptr<SharedRing> SharedRing::create(int fd, int64_t capacity, int64_t alignment) {
  check_arena("SharedRing", capacity, alignment);
  const int64_t size = mapping_size(capacity);
  if (ftruncate(fd, size) != 0) {
    throw std::runtime_error("SharedRing: cannot size the shared memory to " +
                             std::to_string(size) + " bytes");
  }
  const int64_t base = map_fd(fd, size);
  auto ring = std::shared_ptr<SharedRing>(new SharedRing(base, size));
  auto* c = reinterpret_cast<SharedControl*>(base);
  c->magic = 0;
  c->capacity = capacity;
  c->data_offset = align_up(static_cast<int64_t>(sizeof(SharedControl)), 4096);
  c->alignment = alignment;
  pthread_mutexattr_t ma;
  check(pthread_mutexattr_init(&ma), "pthread_mutexattr_init");
  check(pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED), "setpshared");
  // Robust: a worker killed while holding the lock does not wedge the others.
  check(pthread_mutexattr_setrobust(&ma, PTHREAD_MUTEX_ROBUST), "setrobust");
  check(pthread_mutex_init(&c->mu, &ma), "pthread_mutex_init");
  pthread_mutexattr_destroy(&ma);
  pthread_condattr_t ca;
  check(pthread_condattr_init(&ca), "pthread_condattr_init");
  check(pthread_condattr_setpshared(&ca, PTHREAD_PROCESS_SHARED), "setpshared");
  check(pthread_condattr_setclock(&ca, CLOCK_MONOTONIC), "setclock");
  check(pthread_cond_init(&c->released, &ca), "pthread_cond_init");
  pthread_condattr_destroy(&ca);
  c->next_generation = 1;
  c->allocations = c->waits = c->reclaimed = c->high_water = 0;
  for (SharedSlot& s : c->slots) s = SharedSlot{kFree, 0, 0, 0, 0};
  __atomic_store_n(&c->magic, kMagic, __ATOMIC_RELEASE);
  return ring;
}

std::shared_ptr<SharedRing> SharedRing::attach(int fd) {
  struct stat st;
  if (fstat(fd, &st) != 0 || st.st_size < static_cast<off_t>(sizeof(SharedControl))) {
    throw std::runtime_error("SharedRing: the shared memory is missing or too small");
  }
  const int64_t base = map_fd(fd, static_cast<int64_t>(st.st_size));
  auto ring = std::shared_ptr<SharedRing>(new SharedRing(base, static_cast<int64_t>(st.st_size)));
  if (__atomic_load_n(&ring->control_->magic, __ATOMIC_ACQUIRE) != kMagic) {
    throw std::runtime_error("SharedRing: the mapping holds no initialized ring");
  }
  return ring;
}

SharedRing::~SharedRing() {
  unregister_pinned();
  munmap(reinterpret_cast<void*>(base_), static_cast<size_t>(size_));
}

int64_t SharedRing::populate(int64_t nbytes) {
  if (nbytes < 0) {
    throw std::invalid_argument("SharedRing.populate: nbytes must be >= 0, got " +
                                std::to_string(nbytes));
  }
  const int64_t n = align_up(std::min(nbytes, control_->capacity), 4096);
  if (n == 0) return 0;
  auto* start = reinterpret_cast<uint8_t*>(data_address());
#ifdef MADV_POPULATE_WRITE
  // Linux 5.14+: allocates and maps the pages writable without changing a byte, so it is safe
  // while other processes write regions of the ring.
  if (madvise(start, static_cast<size_t>(n), MADV_POPULATE_WRITE) == 0) return n;
#endif
  // Older kernels: read one byte of each page (maps them; allocation of untouched shmem pages
  // then happens on their first write, as before).
  volatile uint8_t sink = 0;
  for (int64_t at = 0; at < n; at += 4096) sink = sink + start[at];
  (void)sink;
  return n;
}

at::Tensor SharedRing::region(int64_t offset, int64_t nbytes) {
  if (offset < 0 || nbytes < 0 || offset > size_ || nbytes > size_ - offset) {
    throw std::invalid_argument("SharedRing.region: out of the mapping");
  }
  std::shared_ptr<SharedRing> keep = shared_from_this();
  return at::from_blob(
      reinterpret_cast<void*>(base_ + offset), {nbytes}, [keep](void*) {},
      at::TensorOptions().dtype(at::kByte).device(at::kCPU));
}

SharedRing::Locked::Locked(SharedControl* control) : mu_(&control->mu) {
  const int rc = pthread_mutex_lock(mu_);
  if (rc == EOWNERDEAD) {
    // Its holder died mid-update: the table is still consistent enough (each field is
    // written whole); mark the mutex usable and let reclaim_dead() free the dead one's regions.
    pthread_mutex_consistent(mu_);
  } else if (rc != 0) {
    throw std::runtime_error("SharedRing: pthread_mutex_lock failed");
  }
}

SharedRing::Locked::~Locked() { pthread_mutex_unlock(mu_); }

void SharedRing::Locked::wait_until(pthread_cond_t* cond, const timespec& wake) {
  if (pthread_cond_timedwait(cond, mu_, &wake) == EOWNERDEAD) pthread_mutex_consistent(mu_);
}

std::tuple<int64_t, int64_t, int64_t> SharedRing::acquire(int64_t nbytes, double timeout_s) {
  SharedControl* c = control_;
  if (nbytes < 0) {
    throw std::invalid_argument("SharedRing.acquire: nbytes must be >= 0, got " +
                                std::to_string(nbytes));
  }
  // Before any arithmetic on it: a request near the int64 limit would overflow the rounding.
  if (nbytes > c->capacity) {
    throw std::invalid_argument("SharedRing.acquire: a batch of " + std::to_string(nbytes) +
                                " bytes is larger than the ring's capacity of " +
                                std::to_string(c->capacity) + " bytes");
  }
  const int64_t size = std::min(c->capacity, align_up(std::max<int64_t>(nbytes, 1), c->alignment));
  const Deadline deadline("SharedRing.acquire", timeout_s);
  Locked locked(c);
  bool waited = false;
  for (;;) {
    // first fit among the gaps between live regions
    std::vector<std::pair<int64_t, int64_t>> used;
    int free_slot = -1;
    for (int i = 0; i < kSharedRingSlots; ++i) {
      if (c->slots[i].state == kFree) {
        if (free_slot < 0) free_slot = i;
      } else {
        used.emplace_back(c->slots[i].offset, c->slots[i].size);
      }
    }
    std::sort(used.begin(), used.end());
    int64_t at = -1, cursor = 0;
    for (const auto& [off, sz] : used) {
      if (off - cursor >= size) {
        at = cursor;
        break;
      }
      cursor = std::max(cursor, off + sz);
    }
    if (at < 0 && c->capacity - cursor >= size) at = cursor;
    if (at >= 0 && free_slot >= 0) {
      SharedSlot& s = c->slots[free_slot];
      s = SharedSlot{kWorker, static_cast<int32_t>(getpid()), at, size, c->next_generation++};
      c->allocations += 1;
      if (waited) c->waits += 1;
      int64_t in_use = size;
      for (const auto& u : used) in_use += u.second;
      c->high_water = std::max(c->high_water, in_use);
      return {free_slot, s.generation, c->data_offset + at};
    }
    // Full: regions of workers that died can go back at once.
    int64_t freed = 0;
    for (SharedSlot& s : c->slots) {
      if (s.state == kWorker && !process_alive(s.pid)) {
        s.state = kFree;
        ++freed;
      }
    }
    if (freed > 0) {
      c->reclaimed += freed;
      continue;
    }
    waited = true;
    if (deadline.passed()) {
      int64_t in_use = 0, by_workers = 0, by_consumer = 0;
      for (const SharedSlot& s : c->slots) {
        if (s.state == kFree) continue;
        in_use += s.size;
        (s.state == kWorker ? by_workers : by_consumer) += 1;
      }
      const int64_t cap = c->capacity;
      throw RingTimeoutError(
          "SharedRing.acquire: timed out " + deadline.describe() + " waiting for space: capacity " +
          std::to_string(cap) + " bytes, " + std::to_string(in_use) + " bytes in use by " +
          std::to_string(by_consumer) + " batch(es) the consumer still holds and " +
          std::to_string(by_workers) + " being written or in transit, request " +
          std::to_string(nbytes) + " bytes (a larger ring, or release batches sooner)");
    }
    // Wake at the deadline, or now and then when waiting without one (to look for dead workers).
    int64_t sec = 0, nsec = 0;
    deadline.next_wake_monotonic(std::chrono::milliseconds(200), &sec, &nsec);
    locked.wait_until(&c->released, timespec{static_cast<time_t>(sec), static_cast<long>(nsec)});
  }
}

void SharedRing::abandon(int64_t slot, int64_t generation) {
  if (slot < 0 || slot >= kSharedRingSlots) {
    throw std::invalid_argument("SharedRing.abandon: no slot " + std::to_string(slot));
  }
  Locked locked(control_);
  SharedSlot& s = control_->slots[slot];
  if (s.generation == generation && s.state == kWorker) {
    s.state = kFree;
    pthread_cond_broadcast(&control_->released);
  }
}

std::tuple<at::Tensor, int64_t, int64_t> SharedRing::lend(int64_t nbytes) {
  if (nbytes < 0) {
    throw std::invalid_argument("SharedRing.lend: nbytes must be >= 0, got " +
                                std::to_string(nbytes));
  }
  if (nbytes > control_->capacity) return {at::Tensor(), -1, -1};
  int64_t slot = 0, generation = 0, offset = 0;
  try {
    // the shortest deadline: one look (dead workers' regions reclaimed), no wait
    std::tie(slot, generation, offset) = acquire(nbytes, std::numeric_limits<double>::min());
  } catch (const RingTimeoutError&) {
    return {at::Tensor(), -1, -1};
  }
  {
    std::lock_guard<std::mutex> guard(local_mu_);
    lent_[slot] = {generation, false};
  }
  std::shared_ptr<SharedRing> keep = shared_from_this();
  at::Tensor t = at::from_blob(
      reinterpret_cast<void*>(base_ + offset), {nbytes},
      [keep, slot, generation](void*) { keep->lent_freed(slot, generation); },
      at::TensorOptions().dtype(at::kByte).device(at::kCPU));
  return {t, slot, generation};
}

bool SharedRing::hand_over(int64_t slot, int64_t generation) {
  std::lock_guard<std::mutex> guard(local_mu_);
  auto it = lent_.find(slot);
  if (it == lent_.end() || it->second.first != generation || it->second.second) return false;
  it->second.second = true;
  return true;
}

void SharedRing::lent_freed(int64_t slot, int64_t generation) {
  bool handed = false;
  {
    std::lock_guard<std::mutex> guard(local_mu_);
    auto it = lent_.find(slot);
    if (it == lent_.end() || it->second.first != generation) return;
    handed = it->second.second;
    lent_.erase(it);
  }
  // Never sent (the collate's output was dropped, or replaced): the region goes back. Once
  // handed over, the main process owns it.
  if (!handed) abandon(slot, generation);
}

at::Tensor SharedRing::view(int64_t slot, int64_t generation, int64_t nbytes) {
  if (slot < 0 || slot >= kSharedRingSlots) {
    throw std::invalid_argument("SharedRing.view: no slot " + std::to_string(slot));
  }
  int64_t offset = 0;
  {
    Locked locked(control_);
    SharedSlot& s = control_->slots[slot];
    if (s.generation != generation || s.state != kWorker || nbytes > s.size) {
      // What the slot holds now says who took it (a region reclaimed from a worker taken for
      // dead, released, or handed out again), and how many regions were reclaimed so far.
      static const char* const kStates[] = {"free", "with a worker", "with the consumer"};
      const bool known = s.state >= 0 && s.state < 3;
      throw std::runtime_error(
          "SharedRing.view: the handle for slot " + std::to_string(slot) + " (generation " +
          std::to_string(generation) + ", " + std::to_string(nbytes) +
          " bytes) is stale (its region was reclaimed or released): the slot is now " +
          (known ? kStates[s.state] : "in an unknown state") + " at generation " +
          std::to_string(s.generation) + ", " + std::to_string(s.size) + " bytes; " +
          std::to_string(control_->reclaimed) + " region(s) reclaimed so far");
    }
    s.state = kConsumer;
    s.pid = static_cast<int32_t>(getpid());
    offset = s.offset;
  }
  {
    std::lock_guard<std::mutex> guard(local_mu_);
    local_[slot] = Local{generation, true, 0};
  }
  std::shared_ptr<SharedRing> keep = shared_from_this();
  return at::from_blob(
      reinterpret_cast<void*>(data_address() + offset), {nbytes},
      [keep, slot, generation](void*) {
        {
          std::lock_guard<std::mutex> guard(keep->local_mu_);
          auto it = keep->local_.find(slot);
          if (it != keep->local_.end() && it->second.generation == generation) {
            it->second.host_held = false;
          }
        }
        keep->release_if_done(slot, generation);
      },
      at::TensorOptions().dtype(at::kByte).device(at::kCPU));
}

void SharedRing::release_if_done(int64_t slot, int64_t generation) {
  {
    std::lock_guard<std::mutex> guard(local_mu_);
    auto it = local_.find(slot);
    if (it == local_.end() || it->second.generation != generation) return;
    const Local& l = it->second;
    if (l.host_held || l.pending_copies > 0) return;
    local_.erase(it);
  }
  Locked locked(control_);
  SharedSlot& s = control_->slots[slot];
  if (s.generation == generation && s.state == kConsumer) {
    s.state = kFree;
    pthread_cond_broadcast(&control_->released);
  }
}

void SharedRing::copies_done(int64_t slot, int64_t generation) {
  // On a CUDA driver thread: no CUDA calls here (release_if_done makes none).
  {
    std::lock_guard<std::mutex> guard(local_mu_);
    auto it = local_.find(slot);
    if (it == local_.end() || it->second.generation != generation) return;
    it->second.pending_copies -= 1;
  }
  release_if_done(slot, generation);
}

int64_t SharedRing::record_many(const std::vector<at::Tensor>& views, int64_t stream,
                                int64_t device) {
  std::vector<std::pair<int64_t, int64_t>> regions;  // (slot, generation), each once
  {
    Locked locked(control_);
    for (const at::Tensor& view : views) {
      const int64_t offset =
          static_cast<int64_t>(reinterpret_cast<uintptr_t>(view.data_ptr())) - data_address();
      int64_t slot = -1;
      for (int i = 0; i < kSharedRingSlots; ++i) {
        const SharedSlot& s = control_->slots[i];
        if (s.state == kConsumer && offset >= s.offset && offset < s.offset + s.size) slot = i;
      }
      if (slot < 0) {
        throw std::invalid_argument("SharedRing.record_many: a tensor does not view a held region");
      }
      const std::pair<int64_t, int64_t> r{slot, control_->slots[slot].generation};
      if (std::find(regions.begin(), regions.end(), r) == regions.end()) regions.push_back(r);
    }
  }
  {
    std::lock_guard<std::mutex> guard(local_mu_);
    for (const auto& [slot, generation] : regions) local_[slot].pending_copies += 1;
  }
  // Released from the stream itself once the copies are done: the workers waiting for space are
  // in other processes and wait on the shared condition the release broadcasts.
  std::shared_ptr<SharedRing> keep = shared_from_this();
  for (size_t i = 0; i < regions.size(); ++i) {
    const auto [slot, generation] = regions[i];
    try {
      after_stream_work("SharedRing.record_many", stream, device,
                        [keep, slot, generation] { keep->copies_done(slot, generation); });
    } catch (...) {
      for (size_t j = i; j < regions.size(); ++j) copies_done(regions[j].first, regions[j].second);
      throw;
    }
  }
  return static_cast<int64_t>(regions.size());
}

bool SharedRing::register_pinned() {
#ifdef TORCHFEED_WITH_CUDA
  int count = 0;
  if (pinned_ || cudaGetDeviceCount(&count) != cudaSuccess || count == 0) return pinned_;
  if (cudaHostRegister(reinterpret_cast<void*>(data_address()),
                       static_cast<size_t>(control_->capacity),
                       cudaHostRegisterDefault) != cudaSuccess) {
    (void)cudaGetLastError();
    throw std::runtime_error("SharedRing: cudaHostRegister failed (is `ulimit -l` too low?)");
  }
  pinned_ = true;
#endif
  return pinned_;
}

void SharedRing::unregister_pinned() {
#ifdef TORCHFEED_WITH_CUDA
  if (pinned_) {
    (void)cudaHostUnregister(reinterpret_cast<void*>(data_address()));
    pinned_ = false;
  }
#endif
}

template <typename Pred>
int64_t SharedRing::reclaim_if(Pred stale) {
  Locked locked(control_);
  int64_t freed = 0;
  for (SharedSlot& s : control_->slots) {
    if (s.state == kWorker && stale(s)) {
      s.state = kFree;
      ++freed;
    }
  }
  control_->reclaimed += freed;
  if (freed) pthread_cond_broadcast(&control_->released);
  return freed;
}

int64_t SharedRing::reclaim_dead() {
  return reclaim_if([](const SharedSlot& s) { return !process_alive(s.pid); });
}

int64_t SharedRing::reclaim_before(int64_t generation) {
  return reclaim_if([generation](const SharedSlot& s) { return s.generation < generation; });
}

int64_t SharedRing::next_generation() {
  Locked locked(control_);
  return control_->next_generation;
}

std::map<std::string, int64_t> SharedRing::stats() {
  Locked locked(control_);
  const SharedControl* c = control_;
  int64_t in_use = 0, by_workers = 0, by_consumer = 0;
  for (const SharedSlot& s : c->slots) {
    if (s.state == kFree) continue;
    in_use += s.size;
    (s.state == kWorker ? by_workers : by_consumer) += 1;
  }
  std::map<std::string, int64_t> out{
      {"capacity", c->capacity},          {"bytes_in_use", in_use},
      {"regions_in_workers", by_workers}, {"regions_in_consumer", by_consumer},
      {"allocations", c->allocations},    {"waits", c->waits},
      {"reclaimed", c->reclaimed},        {"high_water", c->high_water}};
  return out;
}

}  // namespace torchfeed
