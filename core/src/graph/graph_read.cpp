// readModelGraph (model_graph.h): TorchScript or ONNX, by the file's first bytes.
#include <cstring>
#include <fstream>

#include "lathe/core/error.h"
#include "lathe/core/model_graph.h"

namespace lathe::core {

ModelGraph readModelGraph(const std::string& path, const GraphOptions& options) {
    char magic[4] = {};
    {
        std::ifstream in(path, std::ios::binary);
        if (!in) throw ConfigError(path + ": no such file or not readable");
        in.read(magic, 4);
    }
    if (std::memcmp(magic, "PK\x03\x04", 4) == 0) return readTorchScriptGraph(path, options);
    return readOnnxGraph(path, options);
}

}  // namespace lathe::core
