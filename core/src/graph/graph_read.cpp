// readModelGraph (model_graph.h): TorchScript or ONNX, by the file's first bytes. TorchScript is
// read by a child process: LibTorch 1.13's torch::jit::load itself dereferences bad pointers on
// some damaged archives (found by tests/fuzz/fuzz_torchscript_graph.cpp), and no check before
// it can rule that out, so the crash has to end a process that is not this one.
#include <cstring>
#include <fstream>

#include "lathe/core/error.h"
#include "lathe/core/executable.h"
#include "lathe/core/model_graph.h"

namespace lathe::core {

namespace {

std::string trimmed(std::string s) {
    while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
    return s;
}

// The last line of what the child wrote to stderr, without lathectl's "lathectl: error: ".
std::string childMessage(const std::string& err) {
    std::string s = trimmed(err);
    const auto nl = s.rfind('\n');
    if (nl != std::string::npos) s = s.substr(nl + 1);
    for (const char* prefix : {"lathectl: error: ", "lathectl: internal error: "})
        if (s.rfind(prefix, 0) == 0) return s.substr(std::strlen(prefix));
    return s;
}

ModelGraph readTorchScriptInChild(const std::string& path, const GraphOptions& options) {
    const std::string program =
        options.readerProgram.empty() ? siblingProgram("lathectl") : options.readerProgram;
    std::vector<std::string> args{"graph", "--format", "json", "--in-process"};
    if (!options.inputShape.empty()) {
        std::string shape;
        for (const auto d : options.inputShape) shape += (shape.empty() ? "" : ",") + std::to_string(d);
        args.insert(args.end(), {"--input-shape", shape});
    }
    args.insert(args.end(), {"--", path});  // a file named "-x.pt" is still a file
    const ProgramResult r = runProgram(program, args, options.readerTimeoutS);
    if (r.timedOut)
        throw ConfigError(path + ": reading it as TorchScript took longer than " +
                          std::to_string(static_cast<int>(options.readerTimeoutS)) + " s, so it was stopped");
    if (r.signal != 0)
        throw ConfigError(path + ": LibTorch's TorchScript loader crashed on this file (" +
                          signalName(r.signal) +
                          " in the reader process; this program is unharmed): it is damaged, or not a "
                          "TorchScript archive that LibTorch 1.13 can load");
    if (r.exitCode == 2) throw ConfigError(childMessage(r.err));
    if (r.exitCode != 0)
        throw Error(path + ": the graph reader (" + program + ") failed with exit status " +
                    std::to_string(r.exitCode) + (r.err.empty() ? "" : ": " + childMessage(r.err)));
    try {
        return graphFromJson(r.out);
    } catch (const ConfigError& ex) {
        throw Error(path + ": the graph reader (" + program + ") wrote something unexpected: " + ex.what());
    }
}

}  // namespace

ModelGraph readModelGraph(const std::string& path, const GraphOptions& options) {
    char magic[4] = {};
    {
        std::ifstream in(path, std::ios::binary);
        if (!in) throw ConfigError(path + ": no such file or not readable");
        in.read(magic, 4);
    }
    if (std::memcmp(magic, "PK\x03\x04", 4) == 0)
        return options.inProcess ? readTorchScriptGraph(path, options)
                                 : readTorchScriptInChild(path, options);
    return readOnnxGraph(path, options);
}

}  // namespace lathe::core
