#pragma once
// Int8 matrix multiplication for quantized inference: the GEMM behind Lathe's int8 Linear
// (and, through im2col, Conv2d) layers.
//
//   y[m][n] = float(C[m][n]) * (sa[m] * sw[n]) + bias[n]      (then max(y, 0) when relu)
//   C[m][n] = sum_k a[m][k] * w[n][k]                          (exact, in int32)
//
// Definitions every path (scalar reference, AVX2, AVX-512 VNNI, AMX; CUDA) follows bit for bit:
//  * Codes are symmetric int8 in [-127, 127] (never -128): activations per row (dynamic) or per
//    tensor (static, a fixed scale), weights per output channel. The int32 sum is exact for
//    K <= kQMaxK = 133,000 (127 * 127 * K < 2^31); callers must not pass longer rows (the
//    quantized TorchScript ops refuse them).
//  * Quantizing a row: amax = max |x|; scale = amax / 127 (fp32 division); codes
//    q = rint(clamp(x * (127 / amax), -127, 127)) in the current rounding mode (nearest even by
//    default). An all-zero row has scale 0 and zero codes; a row holding inf or NaN has scale NaN
//    (so its outputs are NaN) and zero codes. Where 127 / amax is not finite (amax below about
//    7e-37) the code is x / scale instead. With a fixed scale (static mode) the same formula runs
//    with the given scale's reciprocal.
//  * The epilogue computes float(C) (round to nearest even), multiplies by the fp32 product
//    sa[m] * sw[n], adds bias[n] (when given), all without FMA contraction, so every path gets
//    the same bits.
//
// Weights are packed once (packWeights) into 16-column blocks of 4-byte k-groups,
//   packed[nb][k / 4][n % 16][k % 4]      (nb = n / 16; K padded to 64, N to 16 with zeros)
// the operand layout of AVX-512 VNNI's vpdpbusd (one 64-byte row = 16 columns x 4 k) and of an
// AMX B tile (16 such rows = 64 k). The same packed bytes serve every path, so a packed model
// file runs on any CPU. colSums[n] = sum_k w[n][k] (the VNNI path's +128 compensation).
//
// Pointers may be unaligned. Work is split across the kernel thread pool (threads()).

#include <cstddef>
#include <cstdint>

namespace lathe::kernels {

// Code paths of the int8 GEMM (a finer choice than CpuIsa: VNNI and AMX matter here).
//   Avx2:       vpmaddubsw on |a| and sign-adjusted w (exact: every pair sum stays < 2^15).
//   Avx512Vnni: vpdpbusd on a + 128 and w, minus 128 * colSums (AVX512F/BW/VNNI).
//   Amx:        tdpbssd on 16x64 tiles (AMX-TILE + AMX-INT8, after Linux grants tile state).
enum class GemmIsa { Scalar, Avx2, Avx512Vnni, Amx };

const char* gemmIsaName(GemmIsa isa) noexcept;  // "scalar", "avx2", "avx512-vnni", "amx"
bool gemmIsaAvailable(GemmIsa isa) noexcept;    // the CPU (and OS) can run it
// The fastest available path. LATHE_KERNELS_ISA=scalar|avx2|avx512|avx512-vnni|amx caps it.
GemmIsa bestGemmIsa() noexcept;

inline constexpr std::size_t kQBlockN = 16;  // columns per packed block
inline constexpr std::size_t kQBlockK = 64;  // K is padded to a multiple of this
inline constexpr std::size_t kQMaxK = 133000;
inline std::size_t qPaddedK(std::size_t k) noexcept { return (k + kQBlockK - 1) / kQBlockK * kQBlockK; }
inline std::size_t qPaddedN(std::size_t n) noexcept { return (n + kQBlockN - 1) / kQBlockN * kQBlockN; }
// Bytes of packed weights for an n x k matrix: qPaddedN(n) * qPaddedK(k).
inline std::size_t packedWeightBytes(std::size_t n, std::size_t k) noexcept {
    return qPaddedN(n) * qPaddedK(k);
}

// Per-output-channel symmetric quantization of fp32 weights w[n][k] (row stride ldw): the row
// rule above, into q[n][k] (row stride k) and scales[n].
void quantizeWeights(const float* w, std::size_t n, std::size_t k, std::size_t ldw, std::int8_t* q,
                     float* scales) noexcept;

// Packs int8 weights q[n][k] (row stride ldq, codes in [-127, 127]) into `packed`
// (packedWeightBytes(n, k) bytes) and colSums (qPaddedN(n) values).
void packWeights(const std::int8_t* q, std::size_t n, std::size_t k, std::size_t ldq, std::int8_t* packed,
                 std::int32_t* colSums) noexcept;

// Quantizes rows x[m][k] (row stride ldx) into q[m][ldq] (ldq >= k, bytes k..ldq zeroed; the
// GEMM reads rows of ldq = qPaddedK(k)) with one scale per row (scales[m]). fixedScale > 0: every row uses
// that scale (static quantization) instead of its own amax.
void quantizeRows(const float* x, std::size_t m, std::size_t k, std::size_t ldx, std::int8_t* q,
                  std::size_t ldq, float* scales, float fixedScale = 0.f,
                  GemmIsa isa = bestGemmIsa()) noexcept;

// C[m][n] (row stride ldc) = exact int32 product of quantized rows a (m rows of stride lda =
// qPaddedK(k), zero-padded as quantizeRows leaves them) and packed weights of n columns.
// For tests and callers that want the raw accumulators.
void gemmS8S32(const std::int8_t* a, std::size_t m, std::size_t k, const std::int8_t* packed,
               const std::int32_t* colSums, std::size_t n, std::int32_t* c, std::size_t ldc,
               GemmIsa isa = bestGemmIsa());

struct QLinear {
    const std::int8_t* packed = nullptr;    // packWeights output
    const std::int32_t* colSums = nullptr;  // packWeights output
    const float* scales = nullptr;          // per output channel
    const float* bias = nullptr;            // n values, or nullptr
    std::size_t n = 0, k = 0;
};

// A quantized Linear layer on fp32 rows: quantizes x (per row, or with fixedInputScale > 0),
// multiplies with the packed weights and writes y[m][n] (row stride ldy) through the epilogue.
void qlinear(const float* x, std::size_t m, std::size_t ldx, const QLinear& w, float* y, std::size_t ldy,
             bool relu = false, float fixedInputScale = 0.f, GemmIsa isa = bestGemmIsa());

// The same on rows already quantized (a: m rows of stride qPaddedK(k); rowScales: m values).
void qlinearQuantized(const std::int8_t* a, const float* rowScales, std::size_t m, const QLinear& w, float* y,
                      std::size_t ldy, bool relu = false, GemmIsa isa = bestGemmIsa());

// Threads the int8 GEMM splits its column blocks over (the calling thread included). Default:
// the machine's hardware threads, or LATHE_KERNEL_THREADS. A call made while another thread's
// GEMM holds the pool runs on the calling thread alone.
int threads() noexcept;
void setThreads(int n) noexcept;  // n < 1 restores the default

namespace cuda {
// The int8 GEMM on a GPU (dp4a), on device pointers (4-byte aligned, as cudaMalloc gives): the
// same packed layout, the same epilogue definitions; `stream` is a cudaStream_t or nullptr.
// Throws CudaError (cuda_device.h).
void gemmS8S32(const std::int8_t* a, std::size_t m, std::size_t k, const std::int8_t* packed, std::size_t n,
               std::int32_t* c, std::size_t ldc, void* stream = nullptr);
void qlinearQuantized(const std::int8_t* a, const float* rowScales, std::size_t m, const std::int8_t* packed,
                      const float* scales, const float* bias, std::size_t n, std::size_t k, float* y,
                      std::size_t ldy, bool relu, void* stream = nullptr);
}  // namespace cuda

}  // namespace lathe::kernels
