// The emulated CUDA runtime, cuBLAS and cuBLASLt for tests/gpu/emu (see cuda_emu.h): host memory
// for device memory, and GEMMs computed in double on the host with cuBLAS's column-major
// semantics. The cuBLASLt stand-in checks what the real library would reject (layouts that do
// not match the operation, epilogue pointers that do not match the epilogue, a GELU aux leading
// dimension that is not a multiple of 8) and records it for ShapeErrors().
// Environment: LOOM_EMU_NO_LT=1 makes the cuBLASLt heuristic find no algorithm, so the ops take
// their cublasGemmEx fallbacks.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <ucontext.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>

thread_local uint3 threadIdx;
thread_local uint3 blockIdx;
thread_local dim3 blockDim;
thread_local dim3 gridDim;

namespace loom::emu {

// Aborts unless [p, p + bytes) lies inside one live device allocation.
void CheckDeviceRange(const void* p, size_t bytes, const char* what);

thread_local Block* current_block = nullptr;

struct EventState {
  bool timing = true;
  bool recorded = false;
  double ms = 0.0;  // host time of the last record
};

namespace {

[[noreturn]] void Die(const char* what) {
  std::fprintf(stderr, "cuda_emu: %s\n", what);
  std::abort();
}

int shape_errors = 0;

void ShapeError(const char* what) {
  std::fprintf(stderr, "cuda_emu: the real library would reject this: %s\n", what);
  ++shape_errors;
}

float Load(const void* p, cudaDataType t, long i) {
  if (t == CUDA_R_32F) return static_cast<const float*>(p)[i];
  if (t == CUDA_R_16BF) return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  Die("unsupported data type");
}

void Store(void* p, cudaDataType t, long i, float v) {
  if (t == CUDA_R_32F) {
    static_cast<float*>(p)[i] = v;
  } else if (t == CUDA_R_16BF) {
    static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16(v);
  } else {
    Die("unsupported data type");
  }
}

// D = alpha op(A) op(B) + beta D (+ bias over rows) (-> aux = pre-GELU, D = GELU), column-major,
// strided-batched.
struct Gemm {
  bool ta = false, tb = false;
  int m = 0, n = 0, k = 0;
  float alpha = 1.0f, beta = 0.0f;
  const void* a = nullptr;
  cudaDataType at = CUDA_R_16BF;
  long lda = 0;
  long long sa = 0;
  const void* b = nullptr;
  cudaDataType bt = CUDA_R_16BF;
  long ldb = 0;
  long long sb = 0;
  void* d = nullptr;
  cudaDataType dt = CUDA_R_16BF;
  long ldd = 0;
  long long sd = 0;
  int batch = 1;
  const void* bias = nullptr;
  void* aux = nullptr;
  long aux_ld = 0;
  bool gelu = false;
};

size_t ElementBytes(cudaDataType t) { return t == CUDA_R_32F ? 4 : 2; }

// Bytes from the start of a column-major (rows x cols, ld) matrix to past its last element,
// over `batch` matrices `stride` elements apart.
size_t Extent(long rows, long cols, long ld, long long stride, int batch, cudaDataType t) {
  if (rows <= 0 || cols <= 0) return 0;
  return static_cast<size_t>((cols - 1) * ld + rows + (batch - 1) * stride) * ElementBytes(t);
}

void RunGemm(const Gemm& g) {
  // Every operand must lie inside device memory (to the granularity of one allocation).
  CheckDeviceRange(g.a, Extent(g.ta ? g.k : g.m, g.ta ? g.m : g.k, g.lda, g.sa, g.batch, g.at),
                   "GEMM operand A");
  CheckDeviceRange(g.b, Extent(g.tb ? g.n : g.k, g.tb ? g.k : g.n, g.ldb, g.sb, g.batch, g.bt),
                   "GEMM operand B");
  CheckDeviceRange(g.d, Extent(g.m, g.n, g.ldd, g.sd, g.batch, g.dt), "GEMM output D");
  if (g.bias != nullptr) CheckDeviceRange(g.bias, Extent(g.m, 1, g.m, 0, 1, g.dt), "GEMM bias");
  if (g.aux != nullptr) {
    CheckDeviceRange(g.aux, Extent(g.m, g.n, g.aux_ld, 0, 1, g.dt), "GEMM GELU aux");
  }
  if (g.lda < (g.ta ? g.k : g.m) || g.ldb < (g.tb ? g.n : g.k) || g.ldd < g.m) {
    ShapeError("leading dimension too small");
  }
  for (int q = 0; q < g.batch; ++q) {
    for (int j = 0; j < g.n; ++j) {
      for (int i = 0; i < g.m; ++i) {
        double acc = 0.0;
        for (int p = 0; p < g.k; ++p) {
          const long ai = q * g.sa + (g.ta ? p + i * g.lda : i + p * g.lda);
          const long bi = q * g.sb + (g.tb ? j + p * g.ldb : p + j * g.ldb);
          acc += static_cast<double>(Load(g.a, g.at, ai)) * Load(g.b, g.bt, bi);
        }
        const long di = q * g.sd + i + j * g.ldd;
        float v = g.alpha * static_cast<float>(acc) +
                  (g.beta != 0.0f ? g.beta * Load(g.d, g.dt, di) : 0.0f);
        if (g.bias != nullptr) v += Load(g.bias, g.dt, i);
        if (g.aux != nullptr) Store(g.aux, g.dt, i + j * g.aux_ld, v);
        if (g.gelu)
          v = 0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
        Store(g.d, g.dt, di, v);
      }
    }
  }
}

struct LtDesc {
  bool ta = false, tb = false;
  int epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  void* aux = nullptr;
  int64_t aux_ld = 0;
};

struct LtLayout {
  cudaDataType type;
  uint64_t rows, cols;
  int64_t ld;
};

template <typename T>
T Read(const void* buf, size_t size) {
  if (size != sizeof(T)) Die("attribute of the wrong size");
  T v;
  std::memcpy(&v, buf, sizeof(T));
  return v;
}

}  // namespace

int ShapeErrors() { return shape_errors; }

namespace {

// The fibers' context switch. On x86-64 a hand-written one: swapcontext also saves and restores
// the signal mask, a system call per switch, which made it 80 % of the emulation's time (a
// block-wide reduction switches through every thread of the block at each barrier). It saves
// what the System V ABI makes callee-saved (rbx, rbp, r12-r15; the kernels leave the x87 control
// word and MXCSR as they are) on the running stack and swaps the stack pointers. Elsewhere,
// ucontext.
#if defined(__x86_64__)
extern "C" void LoomEmuSwitch(void** save_sp, void* resume_sp);
asm(R"(
  .text
  .globl LoomEmuSwitch
  .type LoomEmuSwitch, @function
LoomEmuSwitch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size LoomEmuSwitch, .-LoomEmuSwitch
)");
struct FiberContext {
  void* sp = nullptr;
};
#else
struct FiberContext {
  ucontext_t uc;
};
#endif

// One CUDA thread of the running block.
struct Fiber {
  enum State { kReady, kAtBlockBarrier, kAtWarpBarrier, kDone };
  FiberContext context;
  std::unique_ptr<char[]> stack;
  State state = kDone;
};

constexpr size_t kFiberStackBytes = 256 << 10;  // touched only as deep as a kernel goes

// The block being run on this host thread.
struct Scheduler {
  FiberContext main;
  std::vector<Fiber> fibers;  // grows to the largest block seen; stacks are reused
  int current = -1;
  const std::function<void()>* body = nullptr;
};

thread_local Scheduler scheduler;

// from := the running context; resumes `to`.
void SwitchTo(FiberContext* from, FiberContext* to) {
#if defined(__x86_64__)
  LoomEmuSwitch(&from->sp, to->sp);
#else
  swapcontext(&from->uc, &to->uc);
#endif
}

void FiberEntry() {
  (*scheduler.body)();
  scheduler.fibers[scheduler.current].state = Fiber::kDone;
#if defined(__x86_64__)
  // Back to the scheduler for good: this stack is re-prepared before it runs again.
  FiberContext finished;
  SwitchTo(&finished, &scheduler.main);
  __builtin_unreachable();
#endif
  // (ucontext) Returning resumes uc_link, the scheduler.
}

// Makes `f` start FiberEntry on its own stack at the next switch to it.
void PrepareFiber(Fiber& f) {
#if defined(__x86_64__)
  // From the top (16-byte aligned): a zero where FiberEntry's caller's return address would be
  // (so that it starts with rsp = 8 mod 16, as after a call), FiberEntry's address for
  // LoomEmuSwitch's ret, and six zeros for the registers it pops.
  auto top = reinterpret_cast<uintptr_t>(f.stack.get() + kFiberStackBytes) & ~uintptr_t{15};
  auto* slot = reinterpret_cast<void**>(top);
  *--slot = nullptr;
  *--slot = reinterpret_cast<void*>(&FiberEntry);
  for (int i = 0; i < 6; ++i) *--slot = nullptr;
  f.context.sp = slot;
#else
  getcontext(&f.context.uc);
  f.context.uc.uc_stack.ss_sp = f.stack.get();
  f.context.uc.uc_stack.ss_size = kFiberStackBytes;
  f.context.uc.uc_link = &scheduler.main.uc;
  makecontext(&f.context.uc, FiberEntry, 0);
#endif
}

// Parks the running fiber in `state` and returns to the scheduler.
void Park(Fiber::State state) {
  Fiber& f = scheduler.fibers[scheduler.current];
  f.state = state;
  SwitchTo(&f.context, &scheduler.main);
}

// Runs one block of `threads` fibers to completion.
void RunBlock(int threads, bool reverse) {
  Scheduler& s = scheduler;
  for (int t = 0; t < threads; ++t) {
    Fiber& f = s.fibers[t];
    if (!f.stack) f.stack.reset(new char[kFiberStackBytes]);
    PrepareFiber(f);
    f.state = Fiber::kReady;
  }
  const int warps = threads / 32;
  for (;;) {
    for (int i = 0; i < threads; ++i) {
      const int t = reverse ? threads - 1 - i : i;
      if (s.fibers[t].state != Fiber::kReady) continue;
      threadIdx = uint3{static_cast<unsigned>(t), 0, 0};
      s.current = t;
      SwitchTo(&s.main, &s.fibers[t].context);
    }
    // Every fiber is done or waiting: release the barriers whose live fibers have all arrived.
    int live = 0, at_block = 0;
    for (int t = 0; t < threads; ++t) {
      live += s.fibers[t].state != Fiber::kDone;
      at_block += s.fibers[t].state == Fiber::kAtBlockBarrier;
    }
    if (live == 0) return;
    bool released = false;
    if (at_block == live) {
      for (int t = 0; t < threads; ++t) {
        if (s.fibers[t].state == Fiber::kAtBlockBarrier) s.fibers[t].state = Fiber::kReady;
      }
      released = true;
    }
    for (int w = 0; w < warps && at_block != live; ++w) {
      int warp_live = 0, at_warp = 0;
      for (int t = w * 32; t < w * 32 + 32; ++t) {
        warp_live += s.fibers[t].state != Fiber::kDone;
        at_warp += s.fibers[t].state == Fiber::kAtWarpBarrier;
      }
      if (warp_live > 0 && at_warp == warp_live) {
        for (int t = w * 32; t < w * 32 + 32; ++t) {
          if (s.fibers[t].state == Fiber::kAtWarpBarrier) s.fibers[t].state = Fiber::kReady;
        }
        released = true;
      }
    }
    // Nothing to release: the threads wait at different barriers, which hangs (or is undefined)
    // on a GPU too.
    if (!released) Die("deadlock: the threads of a block wait at different barriers");
  }
}

}  // namespace

void BlockSync() { Park(Fiber::kAtBlockBarrier); }
void WarpSync() { Park(Fiber::kAtWarpBarrier); }

void RunGrid(dim3 grid, dim3 block, const std::function<void()>& body) {
  if (block.y != 1 || block.z != 1 || block.x == 0 || block.x > 1024 || block.x % 32 != 0) {
    Die("only 1-D blocks of a multiple of 32 threads (at most 1024)");
  }
  if (grid.y > 65535 || grid.z > 65535) Die("grid.y or grid.z above 65535");
  if (scheduler.body != nullptr) Die("a kernel launch from inside a kernel");
  const int threads = static_cast<int>(block.x);
  if (scheduler.fibers.size() < static_cast<size_t>(threads)) scheduler.fibers.resize(threads);
  scheduler.body = &body;
  Block b;
  current_block = &b;
  blockDim = block;
  gridDim = grid;
  long index = 0;
  for (unsigned bz = 0; bz < grid.z; ++bz) {
    for (unsigned by = 0; by < grid.y; ++by) {
      for (unsigned bx = 0; bx < grid.x; ++bx, ++index) {
        b.slots.assign(threads / 32, {});
        b.tiles.assign(threads / 32, {});
        b.or_result = 0;
        blockIdx = uint3{bx, by, bz};
        RunBlock(threads, index % 2 == 1);
      }
    }
  }
  scheduler.body = nullptr;
  current_block = nullptr;
}

// ---- Device memory, streams and events ----
//
// Device memory is host memory filled with 0xFF bytes (NaN as fp32 and as bf16) when allocated,
// as a GPU's fresh memory holds garbage: a buffer read before it is written shows up as NaN
// instead of hiding behind the zeros of fresh host pages. Every allocation is tracked, so copies
// and memsets that leave a live allocation are reported (the real runtime fails or corrupts).

constexpr size_t kDeviceBytes = size_t{141} << 30;  // what an H200 reports

namespace {

struct Handles {
  std::mutex mu;
  std::map<uintptr_t, size_t> allocations;  // base -> bytes
  size_t bytes_in_use = 0;
  uint64_t num_allocs = 0;  // successful cudaMalloc calls
  std::set<uintptr_t> streams;
  std::map<uintptr_t, EventState> events;
};

Handles& State() {
  static Handles* h = new Handles;  // never destroyed: handles may be released at exit
  return *h;
}

// True when [p, p + bytes) lies inside one live allocation.
bool InDevice(const Handles& h, const void* p, size_t bytes) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto it = h.allocations.upper_bound(a);
  if (it == h.allocations.begin()) return false;
  --it;
  return a >= it->first && a + bytes <= it->first + it->second;
}

double NowMs() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

cudaError_t DeviceAlloc(void** p, size_t bytes) {
  const size_t rounded = (std::max<size_t>(bytes, 1) + 255) / 256 * 256;  // 256-byte aligned
  *p = std::aligned_alloc(256, rounded);
  if (*p == nullptr) return cudaErrorMemoryAllocation;
  std::memset(*p, 0xFF, rounded);
  Handles& h = State();
  std::lock_guard<std::mutex> lock(h.mu);
  h.allocations[reinterpret_cast<uintptr_t>(*p)] = bytes;
  h.bytes_in_use += rounded;
  ++h.num_allocs;
  return cudaSuccess;
}

void DeviceFree(void* p) {
  if (p == nullptr) return;
  Handles& h = State();
  {
    std::lock_guard<std::mutex> lock(h.mu);
    auto it = h.allocations.find(reinterpret_cast<uintptr_t>(p));
    if (it == h.allocations.end()) Die("cudaFree of a pointer cudaMalloc did not return");
    h.bytes_in_use -= (std::max<size_t>(it->second, 1) + 255) / 256 * 256;
    h.allocations.erase(it);
  }
  std::free(p);
}

uint64_t DeviceAllocCount() {
  Handles& h = State();
  std::lock_guard<std::mutex> lock(h.mu);
  return h.num_allocs;
}

size_t DeviceBytesInUse() {
  Handles& h = State();
  std::lock_guard<std::mutex> lock(h.mu);
  return h.bytes_in_use;
}

void CheckDeviceRange(const void* p, size_t bytes, const char* what) {
  Handles& h = State();
  std::lock_guard<std::mutex> lock(h.mu);
  if (!InDevice(h, p, bytes)) {
    std::fprintf(stderr, "cuda_emu: %s: [%p, +%zu) is not inside one live device allocation\n",
                 what, p, bytes);
    std::abort();
  }
}

void CheckDevicePointer(const void* p, const char* what) { CheckDeviceRange(p, 0, what); }

void CheckCopy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  if (bytes == 0) return;
  const bool dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const bool src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  if (kind == cudaMemcpyDefault || kind == cudaMemcpyHostToHost) return;
  if (dst_dev) CheckDeviceRange(dst, bytes, "cudaMemcpy destination");
  if (src_dev) CheckDeviceRange(src, bytes, "cudaMemcpy source");
  Handles& h = State();
  std::lock_guard<std::mutex> lock(h.mu);
  if ((!dst_dev && InDevice(h, dst, 1)) || (!src_dev && InDevice(h, src, 1))) {
    Die("cudaMemcpy: a host pointer of the copy kind is device memory");
  }
}

cudaStream_t NewStream() {
  auto* token = new char[1];  // a unique address; never reused while the stream lives
  Handles& h = State();
  std::lock_guard<std::mutex> lock(h.mu);
  h.streams.insert(reinterpret_cast<uintptr_t>(token));
  return reinterpret_cast<cudaStream_t>(token);
}

void DestroyStream(cudaStream_t stream) {
  Handles& h = State();
  std::lock_guard<std::mutex> lock(h.mu);
  if (h.streams.erase(reinterpret_cast<uintptr_t>(stream)) != 1) {
    Die("cudaStreamDestroy of a stream that does not exist");
  }
  delete[] reinterpret_cast<char*>(stream);
}

void CheckStream(cudaStream_t stream, const char* what) {
  if (stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread) return;
  Handles& h = State();
  std::lock_guard<std::mutex> lock(h.mu);
  if (h.streams.count(reinterpret_cast<uintptr_t>(stream)) == 0) {
    std::fprintf(stderr, "cuda_emu: %s on a stream that does not exist\n", what);
    std::abort();
  }
}

cudaEvent_t NewEvent(bool timing) {
  auto* token = new char[1];
  Handles& h = State();
  std::lock_guard<std::mutex> lock(h.mu);
  h.events[reinterpret_cast<uintptr_t>(token)] = EventState{timing, false, 0.0};
  return reinterpret_cast<cudaEvent_t>(token);
}

void DestroyEvent(cudaEvent_t event) {
  Handles& h = State();
  std::lock_guard<std::mutex> lock(h.mu);
  if (h.events.erase(reinterpret_cast<uintptr_t>(event)) != 1) {
    Die("cudaEventDestroy of an event that does not exist");
  }
  delete[] reinterpret_cast<char*>(event);
}

void CheckEvent(cudaEvent_t event, const char* what) {
  Handles& h = State();
  std::lock_guard<std::mutex> lock(h.mu);
  if (h.events.count(reinterpret_cast<uintptr_t>(event)) == 0) {
    std::fprintf(stderr, "cuda_emu: %s on an event that does not exist\n", what);
    std::abort();
  }
}

void RecordEvent(cudaEvent_t event) {
  Handles& h = State();
  std::lock_guard<std::mutex> lock(h.mu);
  auto it = h.events.find(reinterpret_cast<uintptr_t>(event));
  if (it == h.events.end()) Die("cudaEventRecord on an event that does not exist");
  it->second.recorded = true;
  it->second.ms = NowMs();
}

// As the real call: both events must exist, time, and have been recorded.
float ElapsedMs(cudaEvent_t start, cudaEvent_t end) {
  Handles& h = State();
  std::lock_guard<std::mutex> lock(h.mu);
  auto a = h.events.find(reinterpret_cast<uintptr_t>(start));
  auto b = h.events.find(reinterpret_cast<uintptr_t>(end));
  if (a == h.events.end() || b == h.events.end()) Die("cudaEventElapsedTime: no such event");
  if (!a->second.timing || !b->second.timing) {
    Die("cudaEventElapsedTime on an event created with cudaEventDisableTiming");
  }
  if (!a->second.recorded || !b->second.recorded) {
    Die("cudaEventElapsedTime on an event never recorded");
  }
  return static_cast<float>(b->second.ms - a->second.ms);
}

}  // namespace loom::emu

using loom::emu::Gemm;
using loom::emu::LtDesc;
using loom::emu::LtLayout;

extern "C" {

cudaError_t cudaMalloc(void** p, size_t bytes) { return loom::emu::DeviceAlloc(p, bytes); }
cudaError_t cudaFree(void* p) {
  loom::emu::DeviceFree(p);
  return cudaSuccess;
}
// Pinned host memory is plain host memory here (copies run at once anyway).
cudaError_t cudaMallocHost(void** p, size_t bytes) {
  *p = std::malloc(bytes);
  return *p != nullptr ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFreeHost(void* p) {
  std::free(p);
  return cudaSuccess;
}
// Asynchronous calls run at once, in the order the host issues them: a legal order for any one
// stream, and the strictest one across streams.
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  loom::emu::CheckCopy(dst, src, bytes, kind);
  std::memcpy(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  loom::emu::CheckStream(stream, "cudaMemcpyAsync");
  return cudaMemcpy(dst, src, bytes, kind);
}
cudaError_t cudaMemset(void* p, int value, size_t bytes) {
  loom::emu::CheckDeviceRange(p, bytes, "cudaMemset");
  std::memset(p, value, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t stream) {
  loom::emu::CheckStream(stream, "cudaMemsetAsync");
  return cudaMemset(p, value, bytes);
}
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  *total_bytes = loom::emu::kDeviceBytes;
  *free_bytes = loom::emu::kDeviceBytes - loom::emu::DeviceBytesInUse();
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
const char* cudaGetErrorName(cudaError_t) { return "cuda_emu"; }
const char* cudaGetErrorString(cudaError_t) { return "cuda_emu"; }
cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  if (device != 0) loom::emu::Die("cudaSetDevice: the emulation has one device, 0");
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetStreamPriorityRange(int* least, int* greatest) {
  *least = 0;  // as an H100/H200
  *greatest = -5;
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  *stream = loom::emu::NewStream();
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int) {
  *stream = loom::emu::NewStream();
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithPriority(cudaStream_t* stream, unsigned int, int priority) {
  if (priority > 0 || priority < -5) loom::emu::Die("stream priority outside [-5, 0]");
  *stream = loom::emu::NewStream();
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  loom::emu::DestroyStream(stream);
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  loom::emu::CheckStream(stream, "cudaStreamSynchronize");
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int) {
  loom::emu::CheckStream(stream, "cudaStreamWaitEvent");
  loom::emu::CheckEvent(event, "cudaStreamWaitEvent");
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  *event = loom::emu::NewEvent(true);
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  *event = loom::emu::NewEvent((flags & cudaEventDisableTiming) == 0);
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  loom::emu::DestroyEvent(event);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  loom::emu::CheckStream(stream, "cudaEventRecord");
  loom::emu::RecordEvent(event);
  return cudaSuccess;
}
// Recorded work has always finished: the emulation runs it when it is issued.
cudaError_t cudaEventQuery(cudaEvent_t event) {
  loom::emu::CheckEvent(event, "cudaEventQuery");
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  loom::emu::CheckEvent(event, "cudaEventSynchronize");
  return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  *ms = loom::emu::ElapsedMs(start, end);
  return cudaSuccess;
}

cublasStatus_t cublasCreate_v2(cublasHandle_t* h) {
  *h = reinterpret_cast<cublasHandle_t>(new char[1]);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy_v2(cublasHandle_t h) {
  delete[] reinterpret_cast<char*>(h);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream_v2(cublasHandle_t, cudaStream_t stream) {
  loom::emu::CheckStream(stream, "cublasSetStream");
  return CUBLAS_STATUS_SUCCESS;
}
const char* cublasGetStatusString(cublasStatus_t) { return "cuda_emu"; }

cublasStatus_t cublasGemmEx(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb, int m,
                            int n, int k, const void* alpha, const void* a, cudaDataType at,
                            int lda, const void* b, cudaDataType bt, int ldb, const void* beta,
                            void* d, cudaDataType dt, int ldd, cublasComputeType_t,
                            cublasGemmAlgo_t) {
  return cublasGemmStridedBatchedEx(nullptr, ta, tb, m, n, k, alpha, a, at, lda, 0, b, bt, ldb, 0,
                                    beta, d, dt, ldd, 0, 1, CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT);
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t, cublasOperation_t ta,
                                          cublasOperation_t tb, int m, int n, int k,
                                          const void* alpha, const void* a, cudaDataType at,
                                          int lda, long long sa, const void* b, cudaDataType bt,
                                          int ldb, long long sb, const void* beta, void* d,
                                          cudaDataType dt, int ldd, long long sd, int batch,
                                          cublasComputeType_t, cublasGemmAlgo_t) {
  Gemm g;
  g.ta = ta == CUBLAS_OP_T;
  g.tb = tb == CUBLAS_OP_T;
  g.m = m;
  g.n = n;
  g.k = k;
  g.alpha = *static_cast<const float*>(alpha);
  g.beta = *static_cast<const float*>(beta);
  g.a = a;
  g.at = at;
  g.lda = lda;
  g.sa = sa;
  g.b = b;
  g.bt = bt;
  g.ldb = ldb;
  g.sb = sb;
  g.d = d;
  g.dt = dt;
  g.ldd = ldd;
  g.sd = sd;
  g.batch = batch;
  loom::emu::RunGemm(g);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtCreate(cublasLtHandle_t* h) {
  *h = reinterpret_cast<cublasLtHandle_t>(new char[1]);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
  delete[] reinterpret_cast<char*>(h);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t,
                                        cudaDataType_t) {
  *desc = reinterpret_cast<cublasLtMatmulDesc_t>(new LtDesc);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  delete reinterpret_cast<LtDesc*>(desc);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                              cublasLtMatmulDescAttributes_t attr, const void* buf,
                                              size_t size) {
  LtDesc* x = reinterpret_cast<LtDesc*>(desc);
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
      x->ta = loom::emu::Read<int32_t>(buf, size) == CUBLAS_OP_T;
      break;
    case CUBLASLT_MATMUL_DESC_TRANSB:
      x->tb = loom::emu::Read<int32_t>(buf, size) == CUBLAS_OP_T;
      break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
      x->epilogue = loom::emu::Read<int32_t>(buf, size);
      break;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
      x->bias = loom::emu::Read<const void*>(buf, size);
      break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER:
      x->aux = loom::emu::Read<void*>(buf, size);
      break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD:
      x->aux_ld = loom::emu::Read<int64_t>(buf, size);
      break;
    default:
      loom::emu::Die("matmul descriptor attribute not emulated");
  }
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
  *layout = reinterpret_cast<cublasLtMatrixLayout_t>(new LtLayout{type, rows, cols, ld});
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  delete reinterpret_cast<LtLayout*>(layout);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  *pref = reinterpret_cast<cublasLtMatmulPreference_t>(new char[1]);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  delete[] reinterpret_cast<char*>(pref);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void* buf, size_t size) {
  if (attr == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES) {
    loom::emu::Read<uint64_t>(buf, size);
  } else {
    loom::emu::Read<uint32_t>(buf, size);  // the MIN_ALIGNMENT_*_BYTES preferences
  }
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t,
                                              cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                              cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                              cublasLtMatmulPreference_t, int,
                                              cublasLtMatmulHeuristicResult_t*, int* found) {
  *found = std::getenv("LOOM_EMU_NO_LT") != nullptr ? 0 : 1;
  return *found ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_SUPPORTED;
}
cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t desc, const void* alpha,
                              const void* a, cublasLtMatrixLayout_t la, const void* b,
                              cublasLtMatrixLayout_t lb, const void* beta, const void* c,
                              cublasLtMatrixLayout_t lc, void* d, cublasLtMatrixLayout_t ld,
                              const cublasLtMatmulAlgo_t*, void*, size_t, cudaStream_t stream) {
  loom::emu::CheckStream(stream, "cublasLtMatmul");
  const LtDesc* x = reinterpret_cast<const LtDesc*>(desc);
  const LtLayout* A = reinterpret_cast<const LtLayout*>(la);
  const LtLayout* B = reinterpret_cast<const LtLayout*>(lb);
  const LtLayout* D = reinterpret_cast<const LtLayout*>(ld);
  if (c != d || lc != ld) loom::emu::Die("only in-place C == D is emulated");
  Gemm g;
  g.ta = x->ta;
  g.tb = x->tb;
  g.m = static_cast<int>(D->rows);
  g.n = static_cast<int>(D->cols);
  g.k = static_cast<int>(x->ta ? A->rows : A->cols);
  if ((x->ta ? A->cols : A->rows) != D->rows || (x->tb ? B->rows : B->cols) != D->cols ||
      (x->tb ? B->cols : B->rows) != static_cast<uint64_t>(g.k)) {
    loom::emu::ShapeError("matrix layouts do not match the operation");
  }
  const bool has_bias =
      x->epilogue == CUBLASLT_EPILOGUE_BIAS || x->epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  g.gelu =
      x->epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || x->epilogue == CUBLASLT_EPILOGUE_GELU_AUX;
  if (has_bias != (x->bias != nullptr) || g.gelu != (x->aux != nullptr)) {
    loom::emu::ShapeError("epilogue pointers do not match the epilogue");
  }
  if (g.gelu && (x->aux_ld % 8 != 0 || x->aux_ld < g.m)) {
    loom::emu::ShapeError("GELU aux leading dimension");
  }
  g.alpha = *static_cast<const float*>(alpha);
  g.beta = *static_cast<const float*>(beta);
  g.a = a;
  g.at = A->type;
  g.lda = A->ld;
  g.b = b;
  g.bt = B->type;
  g.ldb = B->ld;
  g.d = d;
  g.dt = D->type;
  g.ldd = D->ld;
  g.bias = has_bias ? x->bias : nullptr;
  g.aux = g.gelu ? x->aux : nullptr;
  g.aux_ld = x->aux_ld;
  loom::emu::RunGemm(g);
  return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"

namespace nvcuda::wmma::internal {

// What a GPU requires of a wmma load or store: a 256-bit aligned pointer and a leading dimension
// that is a multiple of 16 bytes.
void CheckTile(const void* p, unsigned ldm, size_t element_bytes, const char* what) {
  if (reinterpret_cast<std::uintptr_t>(p) % 32 != 0) {
    std::fprintf(stderr, "cuda_emu: %s: pointer %p is not 32-byte aligned\n", what, p);
    std::abort();
  }
  if (ldm * element_bytes % 16 != 0) {
    std::fprintf(stderr, "cuda_emu: %s: ldm %u is not a multiple of 16 bytes\n", what, ldm);
    std::abort();
  }
}

}  // namespace nvcuda::wmma::internal
