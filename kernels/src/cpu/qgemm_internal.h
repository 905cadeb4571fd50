#pragma once
// Shared pieces of the int8 GEMM (qgemm.h): the job description the dispatcher hands to the
// per-ISA drivers (qgemm.cpp, qgemm_avx2.cpp, qgemm_avx512.cpp, qgemm_amx.cpp), and the one
// epilogue they all call on each finished int32 tile, so that every path produces the same bits.

#include "lathe/kernels/qgemm.h"

#include <cmath>
#include <cstddef>
#include <cstdint>

namespace lathe::kernels::detail {

struct GemmJob {
    // m rows of stride kp, zero-padded past k. The AVX-512 VNNI path reads them biased: each
    // byte XOR 0x80, i.e. a + 128 as an unsigned byte (runGemm prepares that copy).
    const std::int8_t* a = nullptr;
    std::size_t m = 0;
    std::size_t kp = 0;  // padded K (multiple of 64)
    const std::int8_t* packed = nullptr;
    const std::int32_t* colSums = nullptr;
    std::size_t blocks = 0;  // column blocks of 16
};

// What happens to a finished tile of C: stored raw (c != nullptr) or turned into fp32 outputs.
struct Epilogue {
    std::int32_t* c = nullptr;
    std::size_t ldc = 0;
    float* y = nullptr;
    std::size_t ldy = 0;
    const float* rowScales = nullptr;
    const float* colScales = nullptr;
    const float* bias = nullptr;
    bool relu = false;
    std::size_t n = 0;  // valid columns; tile columns at or past n are dropped

    // Rows [m0, m0 + rows) and columns [col0, col0 + cols) of C, as tile[r * ldt + j].
    void apply(std::size_t m0, std::size_t rows, std::size_t col0, std::size_t cols, const std::int32_t* tile,
               std::size_t ldt) const noexcept;
};

// Each driver computes column blocks [nb0, nb1) for all rows of the job.
void gemmRangeScalar(const GemmJob& j, std::size_t nb0, std::size_t nb1, const Epilogue& e) noexcept;
void gemmRangeAvx2(const GemmJob& j, std::size_t nb0, std::size_t nb1, const Epilogue& e) noexcept;
void gemmRangeAvx512Vnni(const GemmJob& j, std::size_t nb0, std::size_t nb1, const Epilogue& e) noexcept;
void gemmRangeAmx(const GemmJob& j, std::size_t nb0, std::size_t nb1, const Epilogue& e) noexcept;

// out[i] = a[i] XOR 0x80 (the code plus 128, as an unsigned byte): the VNNI path's operand.
void biasCodesAvx512(const std::int8_t* a, std::size_t bytes, std::int8_t* out) noexcept;

// Row quantization: the scalar definition for rows [r0, r1), and the AVX2 one (bit-identical).
void quantizeRowsScalar(const float* x, std::size_t r0, std::size_t r1, std::size_t k, std::size_t ldx,
                        std::int8_t* q, std::size_t ldq, float* scales, float fixedScale) noexcept;
void quantizeRowsAvx2(const float* x, std::size_t m, std::size_t k, std::size_t ldx, std::int8_t* q,
                      std::size_t ldq, float* scales, float fixedScale) noexcept;

// The scale and the multiplier of one row under the definition in qgemm.h: scale = amax / 127,
// inv = 127 / amax (dynamic) or scale = fixed, inv = 1 / fixed. Returns false when the row is
// coded as zeros (scale 0 or NaN); `divide` is set where inv is not finite.
bool rowScale(float amax, float fixedScale, float& scale, float& inv, bool& divide) noexcept;

// A row's start on every path: its scale from max |x| (as bits) into `scale`, its codes zeroed
// (padding included). Returns whether the row gets codes (see rowScale).
bool beginRow(std::uint32_t amaxBits, float fixedScale, std::int8_t* out, std::size_t ldq, float& scale,
              float& inv, bool& divide) noexcept;

// One code from a scaled value v = x * inv (or x / scale): rint(clamp(v, -127, 127)).
inline std::int8_t codeOf(float v) noexcept {
    v = v < -127.f ? -127.f : (v > 127.f ? 127.f : v);
    return static_cast<std::int8_t>(std::nearbyint(v));
}

// Whether the OS granted this process AMX tile state (asked once; Linux needs arch_prctl).
bool amxPermitted() noexcept;

}  // namespace lathe::kernels::detail
