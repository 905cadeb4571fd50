#pragma once
// The flags every benchmark takes: --out DIR (where its JSON goes) and --quick (shorter runs).
// A benchmark's own flags are left for it to read.
#include <string>

namespace lathe::test {

struct BenchArgs {
    std::string out;
    bool quick = false;
};

inline BenchArgs benchArgs(int argc, char** argv) {
    BenchArgs a;
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        if (arg == "--out" && i + 1 < argc)
            a.out = argv[++i];
        else if (arg == "--quick")
            a.quick = true;
    }
    return a;
}

}  // namespace lathe::test
