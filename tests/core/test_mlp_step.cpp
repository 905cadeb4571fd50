// The plain-MLP step (training/mlp_step.h) against autograd on the same network and batch: the
// loss, the logits and every gradient, over several steps (buffers reused, gradients overwritten
// rather than accumulated, a smaller last batch); which networks and batches it takes; a digits
// run by hand against the same run through autograd.

// LibTorch first: its glog defines a CHECK that Catch's must replace.
#include <torch/torch.h>

#include <cstdlib>

#include "lathe/core/record.h"
#include "lathe/core/store.h"
#include "lathe/core/trainer.h"
#include "temp_dir.h"
#include "training/mlp_step.h"
// clang-format off
#include <catch2/catch.hpp>
// clang-format on

using lathe::core::MlpStep;

namespace {

// Autograd's step on a copy of the network: loss, logits and the gradients in parameter order.
struct Reference {
    double loss = 0;
    torch::Tensor logits;
    std::vector<torch::Tensor> grads;
};

Reference autogradStep(torch::nn::Sequential& model, const torch::Tensor& x, const torch::Tensor& y) {
    auto copy = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(model->clone());
    auto out = copy->forward(x);
    auto loss = torch::nn::functional::cross_entropy(out, y);
    loss.backward();
    Reference r;
    r.loss = loss.item<double>();
    r.logits = out.detach();
    for (const auto& p : copy->parameters()) r.grads.push_back(p.grad().clone());
    return r;
}

// |a - b| within `tol` of b's largest magnitude (float32 sums in another order).
void checkClose(const torch::Tensor& a, const torch::Tensor& b, double tol = 2e-6) {
    REQUIRE(a.sizes() == b.sizes());
    const double scale = b.abs().max().item<double>() + 1e-12;
    const double diff = (a - b).abs().max().item<double>();
    INFO("max |difference| " << diff << " against a largest magnitude of " << scale);
    CHECK(diff <= tol * scale);
}

}  // namespace

TEST_CASE("the MLP step computes autograd's loss, logits and gradients, step after step", "[mlp_step]") {
    torch::manual_seed(3);
    torch::nn::Sequential model;
    const std::string shape = GENERATE(as<std::string>{}, "digits", "no-bias", "relu-last");
    INFO(shape);
    if (shape == "digits") {  // as the zoo's mlp: Flatten, then Linear/ReLU pairs
        model->push_back(torch::nn::Flatten());
        model->push_back(torch::nn::Linear(64, 128));
        model->push_back(torch::nn::ReLU());
        model->push_back(torch::nn::Linear(128, 128));
        model->push_back(torch::nn::ReLU());
        model->push_back(torch::nn::Linear(128, 10));
    } else if (shape == "no-bias") {
        model->push_back(torch::nn::Linear(torch::nn::LinearOptions(64, 33).bias(false)));
        model->push_back(torch::nn::ReLU());
        model->push_back(torch::nn::Linear(33, 7));
    } else {
        model->push_back(torch::nn::Linear(64, 20));
        model->push_back(torch::nn::Linear(20, 5));
        model->push_back(torch::nn::ReLU());
    }
    auto step = MlpStep::of(model);
    REQUIRE(step);
    const int64_t classes = shape == "digits" ? 10 : shape == "no-bias" ? 7 : 5;
    // Steps of 64, 17 (an epoch's last) and 64 again, the weights changed between them as an
    // optimizer would; inputs with exact zeros and negatives, so ReLU's boundary is crossed.
    for (const int64_t batch : {64, 17, 64}) {
        INFO("batch " << batch);
        auto x = shape == "digits" ? torch::randn({batch, 8, 8}) : torch::randn({batch, 64});
        x.masked_fill_(torch::rand(x.sizes()) < 0.1, 0.0);
        auto y = torch::randint(0, classes, {batch}, torch::kLong);
        REQUIRE(step->accepts(x, y));
        const auto ref = autogradStep(model, x, y);
        const auto r = step->run(x, y);
        CHECK(r.loss == Approx(ref.loss).epsilon(1e-6));
        checkClose(r.logits, ref.logits);
        const auto params = model->parameters();
        REQUIRE(params.size() == ref.grads.size());
        for (size_t i = 0; i < params.size(); ++i) {
            INFO("parameter " << i);
            REQUIRE(params[i].grad().defined());
            checkClose(params[i].grad(), ref.grads[i]);
        }
        torch::NoGradGuard noGrad;
        for (auto& p : model->parameters()) p.add_(p.grad(), -0.5);
    }
}

TEST_CASE("the MLP step takes plain fp32 MLPs and batches it can compute, and leaves the rest to autograd",
          "[mlp_step]") {
    auto mlp = [] {
        torch::nn::Sequential m;
        m->push_back(torch::nn::Linear(4, 8));
        m->push_back(torch::nn::ReLU());
        m->push_back(torch::nn::Linear(8, 3));
        return m;
    };
    auto m = mlp();
    auto step = MlpStep::of(m);
    REQUIRE(step);
    const auto x = torch::randn({5, 4});
    const auto y = torch::tensor({0, 1, 2, 0, 1}, torch::kLong);
    CHECK(step->accepts(x, y));
    CHECK_FALSE(step->accepts(x, torch::tensor({0, 1, 3, 0, 1}, torch::kLong)));   // a label past the classes
    CHECK_FALSE(step->accepts(x, torch::tensor({0, 1, -1, 0, 1}, torch::kLong)));  // a negative label
    CHECK_FALSE(step->accepts(x, y.to(torch::kInt)));
    CHECK_FALSE(step->accepts(x.to(torch::kDouble), y));
    CHECK_FALSE(step->accepts(torch::randn({4, 5}).t(), y));  // not contiguous
    CHECK_FALSE(step->accepts(torch::randn({5, 3}), y));      // another width
    CHECK_FALSE(step->accepts(x.narrow(0, 0, 4), y));         // labels for another batch
    m->to(torch::kDouble);
    CHECK_FALSE(step->accepts(x, y));  // the network was cast after the step was made

    auto with = [&](auto extra, bool first) {
        torch::nn::Sequential s;
        if (first) s->push_back(extra);
        s->push_back(torch::nn::Linear(4, 3));
        if (!first) s->push_back(extra);
        return MlpStep::of(s);
    };
    CHECK_FALSE(with(torch::nn::Dropout(0.5), false));
    CHECK_FALSE(with(torch::nn::Tanh(), false));
    CHECK_FALSE(with(torch::nn::Flatten(), false));  // a Flatten only as the first layer
    CHECK_FALSE(with(torch::nn::Flatten(torch::nn::FlattenOptions().start_dim(0)), true));
    CHECK(with(torch::nn::Flatten(), true));
    torch::nn::Sequential square;
    torch::nn::Linear same(4, 4);
    square->push_back(same);
    square->push_back(same);  // one module twice: shared weights, whose gradients add up
    CHECK_FALSE(MlpStep::of(square));
    auto flat = mlp();
    auto flatStep = MlpStep::of(flat);
    CHECK_FALSE(flatStep->accepts(torch::randn({5, 2, 2}), y));  // no Flatten: autograd's error
    auto resized = mlp();
    auto resizedStep = MlpStep::of(resized);
    resized->ptr(2)->as<torch::nn::Linear>()->bias =
        torch::zeros({2}).requires_grad_();  // not the layer's size
    CHECK_FALSE(resizedStep->accepts(x, y));
    auto frozenLater = mlp();
    auto frozenStep = MlpStep::of(frozenLater);
    frozenLater->ptr(0)->parameters()[0].requires_grad_(false);
    CHECK_FALSE(frozenStep->accepts(x, y));
    auto twoRelu = mlp();
    twoRelu->push_back(torch::nn::ReLU());
    twoRelu->push_back(torch::nn::ReLU());
    CHECK_FALSE(MlpStep::of(twoRelu));
    auto frozen = mlp();
    frozen->ptr(0)->parameters()[0].requires_grad_(false);  // a frozen layer: autograd's step
    CHECK_FALSE(MlpStep::of(frozen));
    torch::nn::Sequential empty;
    CHECK_FALSE(MlpStep::of(empty));
}

TEST_CASE("a plain MLP trains by hand as it does through autograd, and says which step it took",
          "[mlp_step]") {
    lathe::test::TempDir dir;
    lathe::core::Store store(dir.file("lathe.db"));
    lathe::core::RunSpec spec;  // digits' MLP
    spec.epochs = 3;
    spec.threads = 1;
    spec.logEvery = 1;
    auto train = [&](bool autograd) {
        struct Env {
            bool on;
            explicit Env(bool o) : on(o) {
                if (on) setenv("LATHE_AUTOGRAD_STEP", "1", 1);
            }
            ~Env() {
                if (on) unsetenv("LATHE_AUTOGRAD_STEP");
            }
        } env(autograd);
        const auto rec = lathe::core::trainAndRecord(store, spec, {});
        REQUIRE(rec.result.status == lathe::core::RunStatus::Completed);
        return rec.runId;
    };
    const auto byHand = train(false), autograd = train(true);
    auto said = [&](int64_t run) {
        for (const auto& l : store.logs(run))
            if (l.text.find("forward and backward by hand") != std::string::npos) return true;
        return false;
    };
    CHECK(said(byHand));
    CHECK_FALSE(said(autograd));
    // The same training, step by step, to float32's rounding (69 steps of Adam).
    for (const char* key : {"train/grad_norm", "train/loss", "val/loss"}) {
        INFO(key);
        const auto a = store.metrics(byHand, key), b = store.metrics(autograd, key);
        REQUIRE(a.size() == b.size());
        REQUIRE(a.size() >= 3);
        for (size_t i = 0; i < a.size(); ++i) {
            INFO("step " << a[i].step);
            CHECK(a[i].value == Approx(b[i].value).epsilon(1e-5));
        }
    }
}
