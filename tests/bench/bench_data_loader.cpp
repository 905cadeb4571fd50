// bench_data_loader: Lathe's side of the data-loader benchmark (bench_data_loader.py runs it next
// to PyTorch's DataLoader on the same images and prints the ratios).
//
//   bench_data_loader --make DIR --per-class K --side S
//       writes an image folder (the built-in digits, 10 classes, JPEG and PNG alternating)
//   bench_data_loader --dir DIR --workers W --batch B --epochs E [--resize R --crop C]
//                     [--cache-memory-mb M] [--cache-disk-gb G --cache-dir D]
//       runs E epochs of the training pipeline (decode, shorter-side resize, random crop, flip,
//       ImageNet normalisation, batches of B) through W loader threads, the first epoch with
//       empty caches, and prints one JSON line per epoch: seconds, samples/s, hit rate per level.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/images.h"
#include "data/loader.h"
#include "data/pipeline.h"
#include "lathe/core/run_spec.h"

using namespace lathe::core;
using namespace lathe::core::data;

int main(int argc, char** argv) {
    std::string make, dir, cacheDir;
    int perClass = 100, side = 96, workers = 2, batch = 32, epochs = 2;
    RunSpec spec;
    spec.resize = 72;
    spec.crop = 64;
    spec.randomCrop = true;
    spec.hflip = true;
    spec.normalize = "imagenet";
    spec.cacheMemoryMb = 512;
    spec.valSplit = 0.0001;  // every image but one is read in training
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string a = argv[i], v = argv[i + 1];
        if (a == "--make")
            make = v;
        else if (a == "--per-class")
            perClass = std::stoi(v);
        else if (a == "--side")
            side = std::stoi(v);
        else if (a == "--dir")
            dir = v;
        else if (a == "--workers")
            workers = std::stoi(v);
        else if (a == "--batch")
            batch = std::stoi(v);
        else if (a == "--epochs")
            epochs = std::stoi(v);
        else if (a == "--resize")
            spec.resize = std::stoi(v);
        else if (a == "--crop")
            spec.crop = std::stoi(v);
        else if (a == "--cache-memory-mb")
            spec.cacheMemoryMb = std::stoll(v);
        else if (a == "--cache-disk-gb")
            spec.cacheDiskGb = std::stod(v);
        else if (a == "--cache-dir")
            cacheDir = v;
        else {
            std::fprintf(stderr, "bench_data_loader: unknown flag %s\n", a.c_str());
            return 2;
        }
    }
    try {
        if (!make.empty()) {
            const auto files = writeDigitImages(make, perClass, side);
            std::printf("{\"images\": %zu}\n", files.size());
            return 0;
        }
        spec.data = "images:" + dir;
        SourceOptions o;
        o.cacheDir = cacheDir;
        const auto sources = openSources(spec, o);
        Loader loader(sources.train, workers, 2 * std::max(1, workers));
        std::vector<int64_t> order(static_cast<size_t>(sources.train->size()));
        std::iota(order.begin(), order.end(), 0);
        for (int e = 0; e < epochs; ++e) {
            std::shuffle(order.begin(), order.end(), std::mt19937_64(static_cast<uint64_t>(e)));
            const auto t0 = std::chrono::steady_clock::now();
            loader.start(order, batch, SampleMode::Train, 42, e);
            LoadedBatch b;
            SampleTally tally;
            int64_t samples = 0;
            double checksum = 0;
            while (loader.next(b)) {
                tally.add(b.tally);
                samples += b.rows;
                checksum += b.buffer.x[0];  // touch the batch, as a training step would
            }
            const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            nlohmann::json j{{"epoch", e + 1},
                             {"samples", samples},
                             {"seconds", s},
                             {"samples_per_s", static_cast<double>(samples) / s},
                             {"checksum", checksum}};
            for (int l = 0; l < kCacheLevels; ++l)
                if (tally.lookups[l] > 0)
                    j[std::string("hit_") + cacheLevelName(l)] =
                        static_cast<double>(tally.hits[l]) / static_cast<double>(tally.lookups[l]);
            std::printf("%s\n", j.dump().c_str());
            std::fflush(stdout);
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_data_loader: %s\n", e.what());
        return 1;
    }
    return 0;
}
