// Image decoding and preprocessing against PIL (Debian python3-pil, which decodes with the same
// libjpeg-turbo and libpng): the same pixels for PNG, JPEG within the IDCT's rounding, resizes
// within one level of PIL's BILINEAR; corrupt and truncated files refused naming the file.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "data/images.h"
#include "lathe/core/error.h"
#include "run_process.h"
#include "skip.h"
#include "temp_dir.h"

using namespace lathe::core;
using lathe::core::data::Image;
using lathe::test::readFile;
using lathe::test::TempDir;
using lathe::test::writeFile;

namespace {

bool havePil() { return lathe::test::runShell("/usr/bin/python3 -c 'import PIL, numpy'").exitCode == 0; }

// Writes a smooth 61x47 RGB test picture (gradients and a disc) as PNG and JPEG, and PIL's own
// decode of each and PIL's BILINEAR resizes of the PNG, as raw bytes.
void makeReferences(const TempDir& dir) {
    const std::string script = dir.file("make.py");
    writeFile(
        script,
        "import numpy as np, sys\n"
        "from PIL import Image\n"
        "d = sys.argv[1]\n"
        "h, w = 47, 61\n"
        "y, x = np.mgrid[0:h, 0:w]\n"
        "r = (x * 255 / (w - 1)).astype(np.uint8)\n"
        "g = (y * 255 / (h - 1)).astype(np.uint8)\n"
        "b = np.where((x - 30) ** 2 + (y - 20) ** 2 < 150, 230, 20).astype(np.uint8)\n"
        "img = Image.fromarray(np.dstack([r, g, b]))\n"
        "img.save(d + '/a.png')\n"
        "img.save(d + '/a.jpg', quality=92)\n"
        "open(d + '/png.raw', 'wb').write(np.asarray(Image.open(d + '/a.png').convert('RGB')).tobytes())\n"
        "open(d + '/jpg.raw', 'wb').write(np.asarray(Image.open(d + '/a.jpg').convert('RGB')).tobytes())\n"
        "open(d + '/gray.raw', 'wb').write(np.asarray(Image.open(d + '/a.png').convert('L')).tobytes())\n"
        "for (rw, rh) in [(20, 15), (122, 94), (32, 32)]:\n"
        "    out = img.resize((rw, rh), Image.BILINEAR)\n"
        "    open(d + '/r%dx%d.raw' % (rw, rh), 'wb').write(np.asarray(out).tobytes())\n");
    const auto r = lathe::test::runShell("/usr/bin/python3 " + script + " " + dir.path());
    INFO(r.err);
    REQUIRE(r.exitCode == 0);
}

int maxDiff(const std::vector<uint8_t>& a, const std::string& b) {
    REQUIRE(a.size() == b.size());
    int worst = 0;
    for (size_t i = 0; i < a.size(); ++i)
        worst =
            std::max(worst, std::abs(static_cast<int>(a[i]) - static_cast<int>(static_cast<uint8_t>(b[i]))));
    return worst;
}

Image solid(int w, int h, int c) {
    Image img;
    img.width = w;
    img.height = h;
    img.channels = c;
    img.pixels.resize(img.stride() * static_cast<size_t>(h));
    for (size_t i = 0; i < img.pixels.size(); ++i) img.pixels[i] = static_cast<uint8_t>(i * 7 % 251);
    return img;
}

}  // namespace

TEST_CASE("PNG and JPEG decode to PIL's pixels, and resizing follows PIL's BILINEAR", "[images]") {
    if (!havePil()) LATHE_SKIP("python3-pil is not installed");
    TempDir dir;
    makeReferences(dir);
    const auto png = data::decodeImageFile(dir.file("a.png"));
    CHECK(png.width == 61);
    CHECK(png.height == 47);
    CHECK(png.channels == 3);
    CHECK(maxDiff(png.pixels, readFile(dir.file("png.raw"))) == 0);
    const auto gray = data::decodeImageFile(dir.file("a.png"), 1);
    CHECK(gray.channels == 1);
    CHECK(maxDiff(gray.pixels, readFile(dir.file("gray.raw"))) == 0);  // PIL's L: ITU-R 601-2 luma
    const auto jpg = data::decodeImageFile(dir.file("a.jpg"));
    CHECK(jpg.width == 61);
    CHECK(maxDiff(jpg.pixels, readFile(dir.file("jpg.raw"))) <= 1);
    for (const auto& [w, h] : std::vector<std::pair<int, int>>{{20, 15}, {122, 94}, {32, 32}}) {
        INFO(w << "x" << h);
        const auto r = data::resizeImage(png, w, h);
        CHECK(r.width == w);
        CHECK(r.height == h);
        // PIL rounds between its two passes and works in fixed point; one level apart at most.
        CHECK(maxDiff(r.pixels,
                      readFile(dir.file("r" + std::to_string(w) + "x" + std::to_string(h) + ".raw"))) <= 1);
    }
}

TEST_CASE("a corrupt, truncated or foreign file is refused naming it", "[images]") {
    TempDir dir;
    writeFile(dir.file("text.jpg"), "not an image at all");
    CHECK_THROWS_WITH(data::decodeImageFile(dir.file("text.jpg")),
                      Catch::Contains("text.jpg") && Catch::Contains("neither a JPEG nor a PNG"));
    writeFile(dir.file("empty.png"), "");
    CHECK_THROWS_WITH(data::decodeImageFile(dir.file("empty.png")), Catch::Contains("empty file"));
    CHECK_THROWS_AS(data::decodeImageFile(dir.file("missing.png")), DataError);
    if (!havePil()) LATHE_SKIP("python3-pil is not installed (for the truncated images)");
    makeReferences(dir);
    for (const char* name : {"a.jpg", "a.png"}) {
        const std::string whole = readFile(dir.file(name));
        const std::string cut = dir.file(std::string("cut-") + name);
        writeFile(cut, whole.substr(0, whole.size() * 2 / 3));
        CHECK_THROWS_WITH(data::decodeImageFile(cut), Catch::Contains(cut));
        // A flipped byte in the middle of the compressed data: an error or an image, never a crash.
        std::string bad = whole;
        bad[bad.size() / 2] = static_cast<char>(bad[bad.size() / 2] ^ 0x5A);
        writeFile(dir.file("bad"), bad);
        try {
            const auto img = data::decodeImageFile(dir.file("bad"));
            CHECK(img.width == 61);
        } catch (const DataError& ex) {
            CHECK_THAT(ex.what(), Catch::Contains("bad"));
        }
    }
}

TEST_CASE("crops, flips, shorter-side resizes and the float conversion", "[images]") {
    const Image img = solid(10, 6, 3);
    const auto crop = data::cropImage(img, 2, 1, 4, 3);
    CHECK(crop.width == 4);
    CHECK(crop.pixels[0] == img.pixels[(1 * 10 + 2) * 3]);
    CHECK(crop.pixels.back() == img.pixels[(3 * 10 + 5) * 3 + 2]);
    CHECK_THROWS_AS(data::cropImage(img, 8, 0, 4, 3), DataError);
    const auto center = data::centerCrop(img, 4, 4);
    CHECK(center.pixels[0] == img.pixels[(1 * 10 + 3) * 3]);
    const auto padded = data::centerCrop(img, 12, 8);  // larger than the image: zeros around it
    CHECK(padded.pixels[0] == 0);
    CHECK(padded.pixels[(1 * 12 + 1) * 3] == img.pixels[0]);
    Image flipped = img;
    data::flipHorizontal(flipped);
    CHECK(flipped.pixels[0] == img.pixels[9 * 3]);
    data::flipHorizontal(flipped);
    CHECK(flipped.pixels == img.pixels);
    const auto tall = data::resizeShorterSide(solid(40, 80, 1), 20);
    CHECK(tall.width == 20);
    CHECK(tall.height == 40);
    const auto same = data::resizeImage(img, 10, 6);
    CHECK(same.pixels == img.pixels);
    // A constant image stays constant through any resize (weights sum to one).
    Image flat = solid(33, 17, 1);
    std::fill(flat.pixels.begin(), flat.pixels.end(), 200);
    for (const auto& [w, h] : std::vector<std::pair<int, int>>{{5, 3}, {66, 34}, {33, 1}}) {
        const auto r = data::resizeImage(flat, w, h);
        CHECK(std::all_of(r.pixels.begin(), r.pixels.end(), [](uint8_t v) { return v == 200; }));
    }
    const float mean[3] = {0.5f, 0.25f, 0.0f}, sd[3] = {0.5f, 0.25f, 1.0f};
    std::vector<float> out(static_cast<size_t>(3 * 10 * 6));
    data::toFloatCHW(img, mean, sd, out.data());
    CHECK(out[0] == Approx((img.pixels[0] / 255.0 - 0.5) / 0.5));
    CHECK(out[60 + 7] == Approx((img.pixels[7 * 3 + 1] / 255.0 - 0.25) / 0.25));
    CHECK(out[120 + 59] == Approx(img.pixels[59 * 3 + 2] / 255.0));
}
