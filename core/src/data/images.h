#pragma once
// Images for the image-folder data source (torch-free): JPEG decoded with libjpeg-turbo's
// TurboJPEG, PNG with libpng's simplified API, and the preprocessing steps of a run spec —
// resize (separable triangle filter widened when shrinking, as PIL's BILINEAR), crops,
// horizontal flip, and conversion to normalised float CHW. Every function is deterministic: the
// same input gives the same bytes on every call and every thread.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace lathe::core::data {

/// 8-bit pixels, row-major, channels interleaved (HWC): 1 (gray) or 3 (RGB).
struct Image {
    int width = 0;
    int height = 0;
    int channels = 3;
    std::vector<uint8_t> pixels;
    size_t stride() const { return static_cast<size_t>(width) * static_cast<size_t>(channels); }
};

/// Decodes a JPEG or PNG held in memory (recognised by its signature, not its name) into
/// `channels` (1 or 3). Throws DataError naming `what` (the file) for a truncated, corrupt or
/// unsupported image, or one larger than 32768 pixels a side.
Image decodeImage(const uint8_t* data, size_t size, const std::string& what, int channels = 3);
/// Reads and decodes a file. Throws DataError naming it.
Image decodeImageFile(const std::string& path, int channels = 3);

/// Resized to width x height: a separable triangle (bilinear) filter whose support grows with the
/// shrink factor, so that shrinking averages every source pixel (antialiased, as PIL's BILINEAR).
Image resizeImage(const Image& in, int width, int height);
/// Resized so that the shorter side is `size`, keeping the aspect ratio (rounded).
Image resizeShorterSide(const Image& in, int size);
/// The rectangle at (x, y) of width x height; throws DataError when it is not inside the image.
Image cropImage(const Image& in, int x, int y, int width, int height);
/// The centred width x height rectangle (the image padded with zeros where it is smaller).
Image centerCrop(const Image& in, int width, int height);
void flipHorizontal(Image& img);

/// Encoded as JPEG (quality 1..100, 4:2:0) with TurboJPEG, or as PNG with libpng. Throws DataError.
std::string encodeJpeg(const Image& img, int quality = 90);
std::string encodePng(const Image& img);

/// An image folder made from the built-in digits (8x8, 10 classes): `perClass` images of each
/// digit in dir/0 .. dir/9, scaled to `side` pixels, tinted and shifted per image, every other
/// one a PNG (the rest JPEG). For tests, benchmarks and the demo. Returns the files written.
std::vector<std::string> writeDigitImages(const std::string& dir, int perClass, int side);

/// Writes channels x height x width floats: (pixel / 255 - mean[c]) / std[c].
void toFloatCHW(const Image& img, const float* mean, const float* std, float* out);

}  // namespace lathe::core::data
