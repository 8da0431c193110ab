// SharedRing: an arena in shared memory (a memfd the main process creates before the workers
// start, mapped by every worker), so that DataLoader workers collate straight into memory the
// main process reads (and, with a GPU, has page-locked with cudaHostRegister): no shared-memory
// file per tensor, no copy into pinned memory.
//
// A control block at the start of the mapping holds a robust, process-shared mutex and a table
// of regions. A worker acquires a region (first fit), writes its batch, and sends a small handle
// through the worker queue; the main process views the region and releases it when the last
// view is freed and every copy event recorded for it has fired. Each region records its owner's
// pid and a generation, so regions held by a worker that died can be reclaimed.
#pragma once

#include <ATen/ATen.h>

#include <pthread.h>

#include <cstdint>
#include <ctime>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "memory/fence.h"

namespace torchfeed {

// Whether process `pid` may be alive: false only when the system says there is no such process.
// The one test of a ring's owner or of a region's worker, in C++ and (bound as
// torchfeed._C.process_alive) in Python.
bool process_alive(int32_t pid);

constexpr int kSharedRingSlots = 128;

struct SharedSlot {
  int32_t state;  // kFree, kWorker (being written or in transit), kConsumer (viewed by main)
  int32_t pid;    // the owner
  int64_t offset, size, generation;
};

struct SharedControl {
  uint64_t magic;
  int64_t capacity;     // bytes of the data area
  int64_t data_offset;  // where the data area starts in the mapping
  int64_t alignment;
  pthread_mutex_t mu;  // robust, process-shared
  pthread_cond_t released;
  int64_t next_generation;
  int64_t allocations, waits, reclaimed;
  int64_t high_water;
  SharedSlot slots[kSharedRingSlots];
};

class SharedRing : public std::enable_shared_from_this<SharedRing> {
 public:
  // Main process: sizes the memfd `fd`, maps it and initializes the control block.
  static std::shared_ptr<SharedRing> create(int fd, int64_t capacity, int64_t alignment);
  // Any process: maps a memfd that `create` initialized. The mapping lives as long as this
  // object, which every tensor viewing it keeps alive.
  static std::shared_ptr<SharedRing> attach(int fd);
  ~SharedRing();

  // Worker: a uint8 tensor over [offset, offset + nbytes) of the mapping (no release).
  at::Tensor region(int64_t offset, int64_t nbytes);

  // Worker: a region of nbytes; (slot, generation, offset from the mapping base). Waits up to
  // timeout_s (< 0: without limit; reclaiming regions of dead workers meanwhile), then throws
  // RingTimeoutError.
  std::tuple<int64_t, int64_t, int64_t> acquire(int64_t nbytes, double timeout_s);
  // Worker: a region that will not be handed over after all (e.g. the collate failed).
  void abandon(int64_t slot, int64_t generation);
  // Worker, in an ordinary DataLoader (a collate recycling its worker's memory): a uint8 tensor
  // over a region of nbytes, with its (slot, generation); an undefined tensor when no region is
  // free now or nbytes exceeds the capacity (it never waits: the caller takes the ordinary path).
  // The region goes back when the tensor is freed, unless it was handed over first.
  std::tuple<at::Tensor, int64_t, int64_t> lend(int64_t nbytes);
  // Worker: a lent region is on its way to the main process, which releases it once its views
  // are gone (view()); false when (slot, generation) is not a region lent here and not yet handed
  // over (then nothing changes).
  bool hand_over(int64_t slot, int64_t generation);
  // Main: a uint8 tensor over the region of a handle; the region is released when the tensor
  // and all its views are freed and the copies recorded for it have finished.
  at::Tensor view(int64_t slot, int64_t generation, int64_t nbytes);
  // Main: fences the regions under `views` (each once) after the work queued now on `stream`
  // (memory/fence.h); returns how many.
  int64_t record_many(const std::vector<at::Tensor>& views, int64_t stream, int64_t device);
  // Makes the first nbytes of the data area resident and mapped in this process (regions are
  // placed first fit from the start), so the batches of the first epoch do not fault their
  // pages in one by one; returns the bytes populated (rounded to pages, at most the capacity).
  int64_t populate(int64_t nbytes);
  // Main: page-locks the data area with cudaHostRegister (returns false without a GPU).
  bool register_pinned();
  // Main: frees regions whose owner process is gone; returns how many.
  int64_t reclaim_dead();
  // Main: frees regions still with workers (written or in transit) that were acquired before
  // `generation` (e.g. batches of an epoch the DataLoader discarded); returns how many.
  int64_t reclaim_before(int64_t generation);
  // The generation the next acquired region will get.
  int64_t next_generation();

  int64_t capacity() const { return control_->capacity; }
  int64_t data_address() const { return base_ + control_->data_offset; }
  bool pinned() const { return pinned_; }
  // capacity, bytes_in_use, regions (worker-held, consumer-held), allocations, waits, reclaimed
  std::map<std::string, int64_t> stats();

 private:
  // The control block's process-shared mutex, held for a scope (released however it ends: a
  // throw inside must never leave every worker blocked); takes over from a holder that died.
  class Locked {
   public:
    explicit Locked(SharedControl* control);
    ~Locked();
    Locked(const Locked&) = delete;
    Locked& operator=(const Locked&) = delete;
    // Waits on `cond` (which shares the mutex) until it is signalled or `wake` passes.
    void wait_until(pthread_cond_t* cond, const timespec& wake);

   private:
    pthread_mutex_t* mu_;
  };

  SharedRing(int64_t base, int64_t size);
  void unregister_pinned();
  void release_if_done(int64_t slot, int64_t generation);
  void copies_done(int64_t slot, int64_t generation);
  void lent_freed(int64_t slot, int64_t generation);
  template <typename Pred>
  int64_t reclaim_if(Pred stale);  // frees worker-held regions for which stale(slot) holds

  int64_t base_;
  int64_t size_;
  SharedControl* control_;
  bool pinned_ = false;
  // main-process side: host views alive and copies pending per slot
  std::mutex local_mu_;
  struct Local {
    int64_t generation;
    bool host_held;
    int64_t pending_copies;
  };
  std::map<int64_t, Local> local_;
  // worker side: regions lent (slot -> generation, handed over)
  std::map<int64_t, std::pair<int64_t, bool>> lent_;
};

}  // namespace torchfeed
