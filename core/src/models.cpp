#include "models.h"

#include "lathe/core/error.h"

namespace lathe::core {
namespace {

torch::nn::Sequential mlp(const RunSpec& spec, int64_t inputs, int64_t classes) {
    torch::nn::Sequential seq;
    seq->push_back(torch::nn::Flatten());
    int64_t width = inputs;
    for (int64_t h : spec.hidden) {
        seq->push_back(torch::nn::Linear(width, h));
        seq->push_back(torch::nn::ReLU());
        width = h;
    }
    seq->push_back(torch::nn::Linear(width, classes));
    return seq;
}

// LeNet-style: two conv/ReLU/pool stages then two linear layers. Pooling stops once the
// feature map is 2×2, so 8×8 digits and 28×28 MNIST both fit.
torch::nn::Sequential cnn(const std::vector<int64_t>& shape, int64_t classes) {
    const int64_t c = shape[0], h = shape[1], w = shape[2];
    torch::nn::Sequential seq;
    int64_t ch = c, hh = h, ww = w;
    for (int64_t out : {16, 32}) {
        seq->push_back(torch::nn::Conv2d(torch::nn::Conv2dOptions(ch, out, 3).padding(1)));
        seq->push_back(torch::nn::ReLU());
        if (hh >= 4 && ww >= 4) {
            seq->push_back(torch::nn::MaxPool2d(torch::nn::MaxPool2dOptions(2)));
            hh /= 2;
            ww /= 2;
        }
        ch = out;
    }
    seq->push_back(torch::nn::Flatten());
    seq->push_back(torch::nn::Linear(ch * hh * ww, 64));
    seq->push_back(torch::nn::ReLU());
    seq->push_back(torch::nn::Linear(64, classes));
    return seq;
}

}  // namespace

torch::nn::Sequential makeModel(const RunSpec& spec, const std::vector<int64_t>& sampleShape, int64_t numClasses) {
    int64_t inputs = 1;
    for (auto s : sampleShape) inputs *= s;
    if (spec.model == "mlp") return mlp(spec, inputs, numClasses);
    if (spec.model == "cnn") {
        if (sampleShape.size() != 3)
            throw ConfigError("model cnn needs image data (C×H×W); data set " + spec.data + " has " +
                              std::to_string(inputs) + " flat features: use model = \"mlp\"");
        if (sampleShape[1] < 2 || sampleShape[2] < 2)
            throw ConfigError("model cnn needs images of at least 2×2 pixels");
        return cnn(sampleShape, numClasses);
    }
    throw ConfigError("`model` must be one of mlp, cnn (got '" + spec.model + "')");
}

int64_t parameterCount(const torch::nn::Module& m) {
    int64_t n = 0;
    for (const auto& p : m.parameters()) n += p.numel();
    return n;
}

}  // namespace lathe::core
