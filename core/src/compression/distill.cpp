// Knowledge distillation (distill.h).
#include "compression/distill.h"

#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/passes/inliner.h>
#include <torch/script.h>

#include "lathe/core/error.h"
#include "training/zoo.h"

namespace lathe::core::compression {
namespace {

namespace F = torch::nn::functional;

std::string firstLine(const std::string& s) { return s.substr(0, s.find('\n')); }

std::string shapeText(const torch::Tensor& t) { return c10::str(t.sizes()); }

// The attention map of Zagoruyko & Komodakis: channel mean of A², flattened, L2-normalised.
torch::Tensor attentionMap(const torch::Tensor& a) {
    return F::normalize(a.to(torch::kFloat).pow(2).mean(1).flatten(1), F::NormalizeFuncOptions().dim(1));
}

class DistillHook : public TrainingHook {
public:
    explicit DistillHook(const RunSpec& spec)
        : m_path(spec.teacher),
          m_temperature(spec.distillTemperature),
          m_alpha(spec.distillAlpha),
          m_hints(spec.distillHints),
          m_hintWeight(spec.hintWeight),
          m_beta(spec.attentionTransfer) {}

    bool wantsBlocks() const override { return m_hints != "none" || m_beta > 0; }

    std::vector<torch::Tensor> parameters(TrainingLoop& loop) override {
        loadTeacher(loop.device());
        // One look at two samples fixes the shapes: the teacher's classes and, for hints and
        // attention transfer, which blocks pair up and what the regressors map.
        const auto x = loop.trainSamples(2);
        std::vector<torch::Tensor> teacherBlocks;
        const auto logits = teacherOutputs(loop.rawInput(x), teacherBlocks);
        if (logits.dim() != 2 || logits.size(1) != loop.numClasses())
            throw ConfigError("teacher " + m_path + " gives outputs of shape " + shapeText(logits) +
                              " for 2 samples, but the data set has " + std::to_string(loop.numClasses()) +
                              " classes: distil on the data the teacher was trained on (--data)");
        if (!wantsBlocks()) return {};
        std::vector<torch::Tensor> studentBlocks;
        {
            torch::NoGradGuard noGrad;
            auto& model = loop.model();
            model->eval();
            forwardWithBlocks(model, x, studentBlocks);
            model->train();
        }
        if (teacherBlocks.empty() || studentBlocks.empty())
            throw ConfigError(
                std::string("hints and attention transfer compare block outputs (after a ReLU), and ") +
                (teacherBlocks.empty() ? "the teacher " + m_path : std::string("the student")) +
                " has none (a quantized teacher fuses them: use its fp32 parent)");
        std::vector<torch::Tensor> params;
        const size_t nt = teacherBlocks.size(), ns = studentBlocks.size();
        if (m_hints != "none") {
            const size_t pairs = m_hints == "last" ? 1 : std::min(nt, ns);
            for (size_t k = 1; k <= pairs; ++k) {
                Hint h;
                h.t = nt - k;
                h.s = ns - k;
                const auto& ft = teacherBlocks[h.t];
                const auto& fs = studentBlocks[h.s];
                if (ft.dim() == 2 && fs.dim() == 2) {
                    h.linear = torch::nn::Linear(fs.size(1), ft.size(1));
                    h.linear->to(loop.device());
                    for (auto& p : h.linear->parameters()) params.push_back(p);
                } else if (ft.dim() == 4 && fs.dim() == 4 && ft.size(2) == fs.size(2) &&
                           ft.size(3) == fs.size(3)) {
                    h.conv = torch::nn::Conv2d(torch::nn::Conv2dOptions(fs.size(1), ft.size(1), 1));
                    h.conv->to(loop.device());
                    for (auto& p : h.conv->parameters()) params.push_back(p);
                } else {
                    throw ConfigError("hint " + std::to_string(k) + ": the teacher's block " +
                                      std::to_string(h.t + 1) + " is " + shapeText(ft) +
                                      " and the student's block " + std::to_string(h.s + 1) + " is " +
                                      shapeText(fs) +
                                      "; a hint needs both flat or both maps of the same height and width "
                                      "(try distill_hints = \"last\")");
                }
                m_hintPairs.push_back(std::move(h));
            }
        }
        if (m_beta > 0) {
            std::vector<size_t> t4, s4;
            for (size_t i = 0; i < nt; ++i)
                if (teacherBlocks[i].dim() == 4) t4.push_back(i);
            for (size_t i = 0; i < ns; ++i)
                if (studentBlocks[i].dim() == 4) s4.push_back(i);
            if (t4.empty() || s4.empty())
                throw ConfigError("attention transfer compares convolutional feature maps, and the " +
                                  std::string(t4.empty() ? "teacher" : "student") +
                                  " has none: use it with cnn models");
            for (size_t k = 1; k <= std::min(t4.size(), s4.size()); ++k) {
                const auto t = t4[t4.size() - k], s = s4[s4.size() - k];
                if (teacherBlocks[t].size(2) != studentBlocks[s].size(2) ||
                    teacherBlocks[t].size(3) != studentBlocks[s].size(3))
                    throw ConfigError("attention transfer: the teacher's block " + std::to_string(t + 1) +
                                      " is " + shapeText(teacherBlocks[t]) + " and the student's block " +
                                      std::to_string(s + 1) + " is " + shapeText(studentBlocks[s]) +
                                      "; their maps must have the same height and width");
                m_atPairs.emplace_back(t, s);
            }
        }
        m_params = params;
        return params;
    }

    torch::Tensor loss(TrainingLoop& loop, const Batch& batch, const torch::Tensor& logits,
                       torch::Tensor loss) override {
        std::vector<torch::Tensor> teacherBlocks;
        const auto teacher = teacherOutputs(loop.rawInput(batch.x), teacherBlocks);
        const double t = m_temperature;
        const auto soft =
            F::kl_div(F::log_softmax(logits.to(torch::kFloat) / t, 1), F::softmax(teacher / t, 1),
                      F::KLDivFuncOptions().reduction(torch::kBatchMean)) *
            (t * t);
        auto total = (1.0 - m_alpha) * loss + m_alpha * soft;
        accumulate(m_soft, soft);
        if (!m_hintPairs.empty()) {
            torch::Tensor hint = torch::zeros({}, logits.options().dtype(torch::kFloat));
            for (auto& h : m_hintPairs) {
                const auto fs = batch.blocks.at(h.s).to(torch::kFloat);
                const auto pred = h.linear ? h.linear->forward(fs) : h.conv->forward(fs);
                // Relative to the teacher's features' energy, so that the hint weighs alike
                // whatever the layers' scale.
                const auto& ft = teacherBlocks.at(h.t);
                hint = hint + (pred - ft).pow(2).sum() / ft.pow(2).sum().clamp_min(1e-12);
            }
            total = total + m_hintWeight * hint;
            accumulate(m_hint, hint);
        }
        if (!m_atPairs.empty()) {
            torch::Tensor at = torch::zeros({}, logits.options().dtype(torch::kFloat));
            for (const auto& [ti, si] : m_atPairs)
                at = at + (attentionMap(batch.blocks.at(si)) - attentionMap(teacherBlocks.at(ti)))
                              .pow(2)
                              .sum(1)
                              .mean();
            total = total + (m_beta / 2.0) * at;
            accumulate(m_at, at);
        }
        ++m_steps;
        return total;
    }

    void afterPhase(TrainingLoop& loop, TrainingPhase phase) override {
        if (phase != TrainingPhase::Epoch || m_steps == 0) return;
        const double n = static_cast<double>(m_steps);
        loop.recordMetric("distill/soft_loss", m_soft.item<double>() / n);
        if (!m_hintPairs.empty()) loop.recordMetric("distill/hint_loss", m_hint.item<double>() / n);
        if (!m_atPairs.empty()) loop.recordMetric("distill/attention_loss", m_at.item<double>() / n);
        m_soft = m_hint = m_at = torch::Tensor();
        m_steps = 0;
    }

    void saveState(std::map<std::string, torch::Tensor>& state) const override {
        for (size_t i = 0; i < m_params.size(); ++i)
            state["distill/regressor/" + std::to_string(i)] = m_params[i];
    }

    void restoreState(const std::map<std::string, torch::Tensor>& state) override {
        torch::NoGradGuard noGrad;
        for (size_t i = 0; i < m_params.size(); ++i) {
            const auto it = state.find("distill/regressor/" + std::to_string(i));
            if (it != state.end() && it->second.sizes() == m_params[i].sizes()) m_params[i].copy_(it->second);
        }
    }

private:
    struct Hint {
        size_t t = 0, s = 0;
        torch::nn::Linear linear{nullptr};
        torch::nn::Conv2d conv{nullptr};
    };

    void loadTeacher(const torch::Device& device) {
        try {
            m_teacher = torch::jit::load(m_path, device);
        } catch (const c10::Error& ex) {
            throw ConfigError("`teacher` " + m_path +
                              " is not a TorchScript model: " + firstLine(ex.what_without_backtrace()));
        }
        m_teacher.eval();
        if (!wantsBlocks()) return;
        // A copy of forward that also returns every block output.
        auto graph = m_teacher.get_method("forward").graph()->copy();
        torch::jit::Inline(*graph);
        const auto relu = c10::Symbol::fromQualString("aten::relu");
        const auto relu_ = c10::Symbol::fromQualString("aten::relu_");
        const auto pool = c10::Symbol::fromQualString("aten::max_pool2d");
        std::vector<torch::jit::Value*> outs{graph->outputs()[0]};
        for (torch::jit::Node* n : graph->nodes()) {
            if (n->kind() != relu && n->kind() != relu_) continue;
            torch::jit::Value* v = n->output();
            if (v->uses().size() == 1 && v->uses()[0].user->kind() == pool) v = v->uses()[0].user->output();
            outs.push_back(v);
        }
        auto* tuple = graph->appendNode(graph->createTuple(outs));
        graph->eraseOutput(0);
        graph->registerOutput(tuple->output());
        m_blocksFn = std::make_unique<torch::jit::GraphFunction>("lathe_teacher_blocks", graph, nullptr);
    }

    // The teacher's logits (fp32, no gradient) and, when blocks are wanted, its block outputs.
    torch::Tensor teacherOutputs(const torch::Tensor& raw, std::vector<torch::Tensor>& blocks) {
        torch::NoGradGuard noGrad;
        try {
            if (!m_blocksFn) {
                const auto out = m_teacher.forward({raw});
                if (!out.isTensor()) throw ConfigError("teacher " + m_path + " does not return one tensor");
                return out.toTensor().to(torch::kFloat);
            }
            const auto out = (*m_blocksFn)({m_teacher._ivalue(), raw}).toTupleRef().elements();
            for (size_t i = 1; i < out.size(); ++i) blocks.push_back(out[i].toTensor().to(torch::kFloat));
            return out[0].toTensor().to(torch::kFloat);
        } catch (const c10::Error& ex) {
            throw ConfigError("teacher " + m_path + " cannot take this data set's samples " + shapeText(raw) +
                              ": " + firstLine(ex.what_without_backtrace()));
        }
    }

    const std::string m_path;
    const double m_temperature, m_alpha;
    const std::string m_hints;
    const double m_hintWeight, m_beta;
    torch::jit::Module m_teacher;
    std::unique_ptr<torch::jit::GraphFunction> m_blocksFn;
    std::vector<Hint> m_hintPairs;
    std::vector<std::pair<size_t, size_t>> m_atPairs;
    std::vector<torch::Tensor> m_params;
    // Sums over the epoch's steps, kept on the device: read once per epoch, not synchronised per step.
    static void accumulate(torch::Tensor& sum, const torch::Tensor& term) {
        const auto v = term.detach().to(torch::kDouble);
        sum = sum.defined() ? sum + v : v;
    }
    torch::Tensor m_soft, m_hint, m_at;
    int64_t m_steps = 0;
};

}  // namespace

std::shared_ptr<TrainingHook> makeDistillHook(const RunSpec& spec) {
    return std::make_shared<DistillHook>(spec);
}

}  // namespace lathe::core::compression
