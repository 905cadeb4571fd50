// Image decoding and preprocessing for the image-folder source. See images.h.
#include "data/images.h"

#include <png.h>
#include <turbojpeg.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>

#include "data/raw.h"
#include "lathe/core/error.h"

namespace lathe::core::data {
namespace {

constexpr int kMaxSide = 32768;

bool isJpeg(const uint8_t* p, size_t n) { return n >= 3 && p[0] == 0xFF && p[1] == 0xD8 && p[2] == 0xFF; }
bool isPng(const uint8_t* p, size_t n) {
    static const uint8_t sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
    return n >= 8 && std::memcmp(p, sig, 8) == 0;
}

// As PIL's decompression-bomb error (twice its MAX_IMAGE_PIXELS): a small file whose header
// promises gigabytes of pixels is refused before anything is allocated.
constexpr int64_t kMaxPixels = 178956970;

void checkSize(int w, int h, const std::string& what) {
    if (w <= 0 || h <= 0 || w > kMaxSide || h > kMaxSide)
        throw DataError(what + ": an image of " + std::to_string(w) + "x" + std::to_string(h) +
                        " pixels is not supported (1..32768 a side)");
    if (static_cast<int64_t>(w) * h > kMaxPixels)
        throw DataError(what + ": an image of " + std::to_string(w) + "x" + std::to_string(h) +
                        " pixels is larger than 178,956,970 pixels (a decompression bomb?)");
}

Image decodeJpeg(const uint8_t* data, size_t size, const std::string& what, int channels) {
    // One decompressor per thread, kept: starting one costs more than decoding a small image.
    // After an error its state is not trusted: the next image gets a fresh one.
    thread_local std::unique_ptr<void, int (*)(tjhandle)> tj(nullptr, &tjDestroy);
    if (!tj) tj.reset(tjInitDecompress());
    if (!tj) throw DataError(what + ": cannot start the JPEG decoder");
    const auto failed = [&](const char* how) {
        DataError e(what + how + tjGetErrorStr2(tj.get()) + ")");
        tj.reset();
        return e;
    };
    int w = 0, h = 0, subsamp = 0, colorspace = 0;
    if (tjDecompressHeader3(tj.get(), data, static_cast<unsigned long>(size), &w, &h, &subsamp,
                            &colorspace) != 0)
        throw failed(": not a readable JPEG (");
    checkSize(w, h, what);
    Image img;
    img.width = w;
    img.height = h;
    img.channels = channels;
    img.pixels.resize(img.stride() * static_cast<size_t>(h));
    // ACCURATEDCT: the same integer IDCT as PIL's default; STOPONWARNING: a truncated file is an
    // error, not an image with a grey bottom.
    const int flags = TJFLAG_ACCURATEDCT | TJFLAG_STOPONWARNING;
    if (tjDecompress2(tj.get(), data, static_cast<unsigned long>(size), img.pixels.data(), w, 0, h,
                      channels == 1 ? TJPF_GRAY : TJPF_RGB, flags) != 0)
        throw failed(": corrupt JPEG (");
    return img;
}

Image decodePng(const uint8_t* data, size_t size, const std::string& what, int channels) {
    png_image png;
    std::memset(&png, 0, sizeof png);
    png.version = PNG_IMAGE_VERSION;
    struct Free {
        png_image* p;
        ~Free() { png_image_free(p); }
    } guard{&png};
    if (!png_image_begin_read_from_memory(&png, data, size))
        throw DataError(what + ": not a readable PNG (" + png.message + ")");
    checkSize(static_cast<int>(png.width), static_cast<int>(png.height), what);
    png.format = channels == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;  // alpha composed onto black
    Image img;
    img.width = static_cast<int>(png.width);
    img.height = static_cast<int>(png.height);
    img.channels = channels;
    img.pixels.resize(PNG_IMAGE_SIZE(png));
    if (!png_image_finish_read(&png, nullptr, img.pixels.data(), 0, nullptr))
        throw DataError(what + ": corrupt PNG (" + png.message + ")");
    return img;
}

// Per output index: the first source index and the normalised weights of the source pixels it
// averages (PIL's resampling: the triangle filter widened by the shrink factor).
struct Taps {
    std::vector<int> first;
    std::vector<int> count;
    std::vector<float> weights;  // count[i] weights per output, `span` apart
    int span = 0;
};

Taps taps(int in, int out) {
    const double scale = static_cast<double>(in) / out;
    const double filterScale = std::max(scale, 1.0);
    const double support = filterScale;  // the triangle's radius 1, widened
    Taps t;
    t.span = static_cast<int>(std::ceil(support)) * 2 + 1;
    t.first.resize(static_cast<size_t>(out));
    t.count.resize(static_cast<size_t>(out));
    t.weights.assign(static_cast<size_t>(out) * static_cast<size_t>(t.span), 0.0f);
    for (int i = 0; i < out; ++i) {
        const double center = (i + 0.5) * scale;
        int lo = static_cast<int>(std::floor(center - support + 0.5));
        int hi = static_cast<int>(std::floor(center + support + 0.5));
        lo = std::max(lo, 0);
        hi = std::min(hi, in);
        double sum = 0;
        std::vector<double> w(static_cast<size_t>(std::max(hi - lo, 0)));
        for (int k = lo; k < hi; ++k) {
            const double x = (k + 0.5 - center) / filterScale;
            const double v = std::max(0.0, 1.0 - std::abs(x));
            w[static_cast<size_t>(k - lo)] = v;
            sum += v;
        }
        t.first[static_cast<size_t>(i)] = lo;
        t.count[static_cast<size_t>(i)] = std::min(hi - lo, t.span);
        for (int k = 0; k < t.count[static_cast<size_t>(i)]; ++k)
            t.weights[static_cast<size_t>(i) * static_cast<size_t>(t.span) + static_cast<size_t>(k)] =
                static_cast<float>(sum > 0 ? w[static_cast<size_t>(k)] / sum : 0.0);
    }
    return t;
}

uint8_t toByte(float v) { return static_cast<uint8_t>(std::clamp(std::lround(v), 0L, 255L)); }

// Gray from RGB as PIL's convert("L") and torchvision's Grayscale: ITU-R 601-2 luma on the
// stored (gamma-encoded) values, in PIL's fixed point — not libpng's linear-light conversion.
Image toGray(const Image& rgb) {
    Image g;
    g.width = rgb.width;
    g.height = rgb.height;
    g.channels = 1;
    g.pixels.resize(static_cast<size_t>(rgb.width) * static_cast<size_t>(rgb.height));
    for (size_t i = 0; i < g.pixels.size(); ++i) {
        const uint8_t* p = rgb.pixels.data() + 3 * i;
        g.pixels[i] = static_cast<uint8_t>((p[0] * 19595u + p[1] * 38470u + p[2] * 7471u + 0x8000u) >> 16);
    }
    return g;
}

}  // namespace

Image decodeImage(const uint8_t* data, size_t size, const std::string& what, int channels) {
    if (channels != 1 && channels != 3) throw DataError(what + ": images are decoded to 1 or 3 channels");
    Image rgb;
    if (isJpeg(data, size))
        rgb = decodeJpeg(data, size, what, 3);
    else if (isPng(data, size))
        rgb = decodePng(data, size, what, 3);
    else
        throw DataError(what + ": neither a JPEG nor a PNG (its first bytes are not their signature)");
    return channels == 3 ? rgb : toGray(rgb);
}

Image decodeImageFile(const std::string& path, int channels) {
    std::ifstream in(path, std::ios::binary | std::ios::ate);
    if (!in) throw DataError("cannot read image " + path);
    const auto size = static_cast<std::streamoff>(in.tellg());
    if (size <= 0) throw DataError(path + ": an empty file is not an image");
    if (size > (1LL << 30)) throw DataError(path + ": larger than 1 GiB; not read as an image");
    std::vector<uint8_t> bytes(static_cast<size_t>(size));
    in.seekg(0);
    if (!in.read(reinterpret_cast<char*>(bytes.data()), size)) throw DataError("cannot read image " + path);
    return decodeImage(bytes.data(), bytes.size(), path, channels);
}

Image resizeImage(const Image& in, int width, int height) {
    if (width <= 0 || height <= 0 || width > kMaxSide || height > kMaxSide)
        throw DataError("resize to " + std::to_string(width) + "x" + std::to_string(height) +
                        " is not possible");
    if (width == in.width && height == in.height) return in;
    const int c = in.channels;
    // Horizontal pass into floats (in.height x width), then vertical into bytes.
    const Taps th = taps(in.width, width), tv = taps(in.height, height);
    std::vector<float> mid(static_cast<size_t>(in.height) * static_cast<size_t>(width) *
                           static_cast<size_t>(c));
    for (int y = 0; y < in.height; ++y) {
        const uint8_t* row = in.pixels.data() + static_cast<size_t>(y) * in.stride();
        float* out =
            mid.data() + static_cast<size_t>(y) * static_cast<size_t>(width) * static_cast<size_t>(c);
        for (int x = 0; x < width; ++x) {
            const float* w = th.weights.data() + static_cast<size_t>(x) * static_cast<size_t>(th.span);
            const int first = th.first[static_cast<size_t>(x)], n = th.count[static_cast<size_t>(x)];
            for (int ch = 0; ch < c; ++ch) {
                float acc = 0;
                for (int k = 0; k < n; ++k) acc += w[k] * row[static_cast<size_t>(first + k) * c + ch];
                out[static_cast<size_t>(x) * c + ch] = acc;
            }
        }
    }
    Image r;
    r.width = width;
    r.height = height;
    r.channels = c;
    r.pixels.resize(r.stride() * static_cast<size_t>(height));
    const size_t midStride = static_cast<size_t>(width) * static_cast<size_t>(c);
    std::vector<float> acc(midStride);
    for (int y = 0; y < height; ++y) {
        std::fill(acc.begin(), acc.end(), 0.0f);
        const float* w = tv.weights.data() + static_cast<size_t>(y) * static_cast<size_t>(tv.span);
        const int first = tv.first[static_cast<size_t>(y)], n = tv.count[static_cast<size_t>(y)];
        for (int k = 0; k < n; ++k) {
            const float* src = mid.data() + static_cast<size_t>(first + k) * midStride;
            for (size_t i = 0; i < midStride; ++i) acc[i] += w[k] * src[i];
        }
        uint8_t* out = r.pixels.data() + static_cast<size_t>(y) * r.stride();
        for (size_t i = 0; i < midStride; ++i) out[i] = toByte(acc[i]);
    }
    return r;
}

Image resizeShorterSide(const Image& in, int size) {
    if (in.width <= in.height) {
        const int h =
            std::max(1, static_cast<int>(std::lround(static_cast<double>(in.height) * size / in.width)));
        return resizeImage(in, size, h);
    }
    const int w =
        std::max(1, static_cast<int>(std::lround(static_cast<double>(in.width) * size / in.height)));
    return resizeImage(in, w, size);
}

Image cropImage(const Image& in, int x, int y, int width, int height) {
    if (x < 0 || y < 0 || width <= 0 || height <= 0 || x + width > in.width || y + height > in.height)
        throw DataError("crop " + std::to_string(width) + "x" + std::to_string(height) + " at (" +
                        std::to_string(x) + ", " + std::to_string(y) + ") is outside a " +
                        std::to_string(in.width) + "x" + std::to_string(in.height) + " image");
    Image r;
    r.width = width;
    r.height = height;
    r.channels = in.channels;
    r.pixels.resize(r.stride() * static_cast<size_t>(height));
    for (int row = 0; row < height; ++row)
        std::memcpy(r.pixels.data() + static_cast<size_t>(row) * r.stride(),
                    in.pixels.data() + static_cast<size_t>(y + row) * in.stride() +
                        static_cast<size_t>(x) * static_cast<size_t>(in.channels),
                    r.stride());
    return r;
}

Image centerCrop(const Image& in, int width, int height) {
    if (width <= in.width && height <= in.height)
        return cropImage(in, (in.width - width) / 2, (in.height - height) / 2, width, height);
    // Smaller than the crop: centred on zeros (torchvision's CenterCrop pads the same way).
    Image r;
    r.width = width;
    r.height = height;
    r.channels = in.channels;
    r.pixels.assign(r.stride() * static_cast<size_t>(height), 0);
    const int ox = (width - in.width) / 2, oy = (height - in.height) / 2;
    for (int y = 0; y < in.height; ++y) {
        const int ty = y + oy;
        if (ty < 0 || ty >= height) continue;
        for (int x = 0; x < in.width; ++x) {
            const int tx = x + ox;
            if (tx < 0 || tx >= width) continue;
            std::memcpy(
                r.pixels.data() + static_cast<size_t>(ty) * r.stride() + static_cast<size_t>(tx) * r.channels,
                in.pixels.data() + static_cast<size_t>(y) * in.stride() +
                    static_cast<size_t>(x) * in.channels,
                static_cast<size_t>(in.channels));
        }
    }
    return r;
}

void flipHorizontal(Image& img) {
    const int c = img.channels;
    for (int y = 0; y < img.height; ++y) {
        uint8_t* row = img.pixels.data() + static_cast<size_t>(y) * img.stride();
        for (int a = 0, b = img.width - 1; a < b; ++a, --b)
            for (int ch = 0; ch < c; ++ch)
                std::swap(row[static_cast<size_t>(a) * c + ch], row[static_cast<size_t>(b) * c + ch]);
    }
}

void toFloatCHW(const Image& img, const float* mean, const float* std, float* out) {
    const size_t plane = static_cast<size_t>(img.width) * static_cast<size_t>(img.height);
    for (int ch = 0; ch < img.channels; ++ch) {
        const float scale = 1.0f / (255.0f * std[ch]);
        const float shift = mean[ch] / std[ch];
        float* dst = out + static_cast<size_t>(ch) * plane;
        const uint8_t* src = img.pixels.data() + ch;
        for (size_t i = 0; i < plane; ++i) dst[i] = static_cast<float>(src[i * img.channels]) * scale - shift;
    }
}

std::string encodeJpeg(const Image& img, int quality) {
    std::unique_ptr<void, int (*)(tjhandle)> tj(tjInitCompress(), &tjDestroy);
    if (!tj) throw DataError("cannot start the JPEG encoder");
    unsigned char* out = nullptr;
    unsigned long size = 0;
    const int rc = tjCompress2(tj.get(), img.pixels.data(), img.width, 0, img.height,
                               img.channels == 1 ? TJPF_GRAY : TJPF_RGB, &out, &size,
                               img.channels == 1 ? TJSAMP_GRAY : TJSAMP_420, std::clamp(quality, 1, 100), 0);
    std::unique_ptr<unsigned char, void (*)(unsigned char*)> owned(out, &tjFree);
    if (rc != 0) throw DataError(std::string("cannot encode a JPEG: ") + tjGetErrorStr2(tj.get()));
    return std::string(reinterpret_cast<const char*>(out), size);
}

std::string encodePng(const Image& img) {
    png_image png;
    std::memset(&png, 0, sizeof png);
    png.version = PNG_IMAGE_VERSION;
    png.width = static_cast<png_uint_32>(img.width);
    png.height = static_cast<png_uint_32>(img.height);
    png.format = img.channels == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
    png_alloc_size_t size = 0;
    if (!png_image_write_to_memory(&png, nullptr, &size, 0, img.pixels.data(), 0, nullptr))
        throw DataError(std::string("cannot encode a PNG: ") + png.message);
    std::string out(size, '\0');
    if (!png_image_write_to_memory(&png, out.data(), &size, 0, img.pixels.data(), 0, nullptr))
        throw DataError(std::string("cannot encode a PNG: ") + png.message);
    out.resize(size);
    return out;
}

std::vector<std::string> writeDigitImages(const std::string& dir, int perClass, int side) {
    const auto path = findResource("data/digits.csv.gz");
    const RawSet digits = parseDigits(readFileMaybeGz(path, 64u << 20), path);
    std::vector<std::string> written;
    std::vector<int> seen(10, 0);
    for (int64_t i = 0; i < digits.size(); ++i) {
        const auto label = static_cast<size_t>(digits.y[static_cast<size_t>(i)]);
        if (label >= seen.size() || seen[label] >= perClass) continue;
        const int k = seen[label]++;
        // 8x8 ink (0..1) on a tinted background, shifted by up to a pixel.
        Image small;
        small.width = small.height = 10;
        small.channels = 3;
        small.pixels.assign(small.stride() * 10, 0);
        const uint8_t bg[3] = {static_cast<uint8_t>(20 + (k * 37) % 60),
                               static_cast<uint8_t>(20 + (k * 53) % 60),
                               static_cast<uint8_t>(20 + (k * 71) % 60)};
        const uint8_t ink[3] = {static_cast<uint8_t>(255 - (k * 29) % 80),
                                static_cast<uint8_t>(200 + (k * 13) % 55),
                                static_cast<uint8_t>(160 + (k * 41) % 95)};
        const int dx = k % 3, dy = (k / 3) % 3;
        for (int y = 0; y < 10; ++y)
            for (int x = 0; x < 10; ++x) {
                const int sx = x - dx, sy = y - dy;
                const float v = (sx >= 0 && sx < 8 && sy >= 0 && sy < 8)
                                    ? digits.x[static_cast<size_t>(i * 64 + sy * 8 + sx)]
                                    : 0.0f;
                for (int c = 0; c < 3; ++c)
                    small.pixels[static_cast<size_t>((y * 10 + x) * 3 + c)] =
                        static_cast<uint8_t>(std::lround(bg[c] + v * (ink[c] - bg[c])));
            }
        const Image img = resizeImage(small, side, side);
        const bool png = k % 2 == 1;
        const std::string classDir = dir + "/" + std::to_string(label);
        std::error_code ec;
        std::filesystem::create_directories(classDir, ec);
        char name[32];
        std::snprintf(name, sizeof name, "%05d.%s", k, png ? "png" : "jpg");
        const std::string file = classDir + "/" + name;
        const std::string bytes = png ? encodePng(img) : encodeJpeg(img, 92);
        std::ofstream out(file, std::ios::binary | std::ios::trunc);
        out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
        if (!out) throw DataError("cannot write " + file);
        written.push_back(file);
    }
    return written;
}

}  // namespace lathe::core::data
