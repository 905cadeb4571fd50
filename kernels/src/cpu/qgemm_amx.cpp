// AMX int8 GEMM: tdpbssd multiplies a 16-row x 64-byte tile of activation codes by a 16 x 64-byte
// B tile (64 k of 16 columns, exactly one packed block's 64-byte rows) into 16 x 16 int32, signed
// by signed: no compensation. A 32-row x 32-column step uses four C tiles, two A and two B.
// Rows past m are read from a zeroed copy, never past the caller's buffer. Linux must have
// granted tile state (amxPermitted) before the first tile instruction, or the process gets SIGILL;
// gemmIsaAvailable(Amx) checks that.

#include "qgemm_internal.h"

#include <cstring>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#define LATHE_KERNELS_AMX 1
#endif

namespace lathe::kernels::detail {

#ifdef LATHE_KERNELS_AMX

#define LATHE_TAMX __attribute__((target("amx-tile,amx-int8,avx512f")))

namespace {

struct alignas(64) TileConfig {
    std::uint8_t palette = 1;
    std::uint8_t startRow = 0;
    std::uint8_t reserved[14] = {};
    std::uint16_t colsb[16] = {};
    std::uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64, "AMX tile configuration is 64 bytes");

// Tiles 0-3: C (16 rows x 16 int32); 4-5: A (16 rows x 64 bytes); 6-7: B (16 rows x 64 bytes).
TileConfig makeConfig() noexcept {
    TileConfig c;
    for (int t = 0; t < 8; ++t) {
        c.rows[t] = 16;
        c.colsb[t] = 64;
    }
    return c;
}

thread_local std::vector<std::int8_t> t_padded;

// 32 rows of A starting at row m0, with rows past m zeroed (a copy only for the last step).
const std::int8_t* rowsFrom(const GemmJob& j, std::size_t m0) {
    if (m0 + 32 <= j.m) return j.a + m0 * j.kp;
    t_padded.assign(32 * j.kp, 0);
    std::memcpy(t_padded.data(), j.a + m0 * j.kp, (j.m - m0) * j.kp);
    return t_padded.data();
}

}  // namespace

LATHE_TAMX void gemmRangeAmx(const GemmJob& j, std::size_t nb0, std::size_t nb1, const Epilogue& e) noexcept {
    static const TileConfig config = makeConfig();
    _tile_loadconfig(&config);
    const std::size_t blockStride = (j.kp / 4) * 64;
    alignas(64) std::int32_t tile[32 * 32];
    for (std::size_t m0 = 0; m0 < j.m; m0 += 32) {
        const std::int8_t* a = rowsFrom(j, m0);
        const std::size_t rows = j.m - m0 < 32 ? j.m - m0 : 32;
        std::size_t nb = nb0;
        for (; nb + 2 <= nb1; nb += 2) {
            const std::int8_t* b0 = j.packed + nb * blockStride;
            const std::int8_t* b1 = b0 + blockStride;
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            for (std::size_t k0 = 0; k0 < j.kp; k0 += 64) {
                _tile_loadd(4, a + k0, j.kp);
                _tile_loadd(5, a + 16 * j.kp + k0, j.kp);
                _tile_loadd(6, b0 + k0 * 16, 64);  // k0 / 4 rows of 64 bytes
                _tile_loadd(7, b1 + k0 * 16, 64);
                _tile_dpbssd(0, 4, 6);
                _tile_dpbssd(1, 4, 7);
                _tile_dpbssd(2, 5, 6);
                _tile_dpbssd(3, 5, 7);
            }
            _tile_stored(0, tile, 128);
            _tile_stored(1, tile + 16, 128);
            _tile_stored(2, tile + 16 * 32, 128);
            _tile_stored(3, tile + 16 * 32 + 16, 128);
            e.apply(m0, rows, nb * 16, 32, tile, 32);
        }
        if (nb < nb1) {
            const std::int8_t* b0 = j.packed + nb * blockStride;
            _tile_zero(0);
            _tile_zero(2);
            for (std::size_t k0 = 0; k0 < j.kp; k0 += 64) {
                _tile_loadd(4, a + k0, j.kp);
                _tile_loadd(5, a + 16 * j.kp + k0, j.kp);
                _tile_loadd(6, b0 + k0 * 16, 64);
                _tile_dpbssd(0, 4, 6);
                _tile_dpbssd(2, 5, 6);
            }
            _tile_stored(0, tile, 64);
            _tile_stored(2, tile + 16 * 16, 64);
            e.apply(m0, rows, nb * 16, 16, tile, 16);
        }
    }
    _tile_release();
}

#else

void gemmRangeAmx(const GemmJob& j, std::size_t nb0, std::size_t nb1, const Epilogue& e) noexcept {
    gemmRangeScalar(j, nb0, nb1, e);
}

#endif

}  // namespace lathe::kernels::detail
