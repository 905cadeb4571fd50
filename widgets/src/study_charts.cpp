#include "study_charts.h"

#include <QLabel>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <optional>
#include <set>

#include "lathe/widgets/qcustomplot_include.h"

namespace lathe::widgets {

namespace {

const QColor kHintColor(0x70, 0x70, 0x70);
const QColor kAxisColor(0x60, 0x60, 0x60);
const QColor kBestColor(0x2c, 0xa0, 0x2c);
const QColor kBarColor(0x1f, 0x77, 0xb4);
constexpr double kHoverRadiusPx = 12.0;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

QString q(const std::string& s) { return QString::fromStdString(s); }

std::string trim(const std::string& s) {
    const auto b = s.find_first_not_of(" \t");
    if (b == std::string::npos) return {};
    const auto e = s.find_last_not_of(" \t");
    return s.substr(b, e - b + 1);
}

// The distribution text of `key` in the study's space ("loguniform(0.0001, 0.1)"), or empty.
std::string distributionOf(const core::StudyRecord& study, const std::string& key) {
    for (const auto& entry : study.space) {
        const auto eq = entry.find('=');
        if (eq != std::string::npos && trim(entry.substr(0, eq)) == key) return trim(entry.substr(eq + 1));
    }
    return {};
}

bool parseNumber(const std::string& text, double& out) {
    const std::string t = trim(text);
    if (t.empty()) return false;
    char* end = nullptr;
    const double v = std::strtod(t.c_str(), &end);
    if (*end != '\0' || !std::isfinite(v)) return false;
    out = v;
    return true;
}

// Viridis: ordered in lightness, readable for colour-blind eyes and in greyscale.
QCPColorGradient viridis() {
    QCPColorGradient g;
    g.clearColorStops();
    g.setColorStopAt(0.0, QColor(0x44, 0x01, 0x54));
    g.setColorStopAt(0.25, QColor(0x3b, 0x52, 0x8b));
    g.setColorStopAt(0.5, QColor(0x21, 0x91, 0x8c));
    g.setColorStopAt(0.75, QColor(0x5e, 0xc9, 0x62));
    g.setColorStopAt(1.0, QColor(0xfd, 0xe7, 0x25));
    g.setColorInterpolation(QCPColorGradient::ciRGB);
    return g;
}

// Widens a range that is a point, so that a single value still gets an axis.
QCPRange nonEmpty(double lo, double hi) {
    if (hi > lo) return {lo, hi};
    const double pad = lo == 0 ? 0.5 : std::abs(lo) * 0.05;
    return {lo - pad, hi + pad};
}

// The axis range of `lo..hi` with 6 % room on each side (multiplicative on a log axis).
QCPRange padded(double lo, double hi, bool log) {
    if (log) {
        if (!(lo > 0) || !(hi > 0)) return {1e-6, 1};
        return hi > lo ? QCPRange(lo / 1.25, hi * 1.25) : QCPRange(lo / 2, hi * 2);
    }
    const QCPRange r = nonEmpty(lo, hi);
    const double pad = (r.upper - r.lower) * 0.06;
    return {r.lower - pad, r.upper + pad};
}

QString paramsText(const core::TrialRecord& t) {
    QStringList parts;
    for (const auto& [key, value] : t.params) parts << QStringLiteral("%1 = %2").arg(q(key), q(value));
    return parts.join(QLatin1Char('\n'));
}

}  // namespace

std::vector<std::string> studyParamKeys(const core::StudyRecord& study,
                                        const std::vector<core::TrialRecord>& trials) {
    std::vector<std::string> keys;
    for (const auto& entry : study.space) {
        const auto eq = entry.find('=');
        if (eq == std::string::npos) continue;
        const std::string key = trim(entry.substr(0, eq));
        if (!key.empty() && std::find(keys.begin(), keys.end(), key) == keys.end()) keys.push_back(key);
    }
    std::set<std::string> others;
    for (const auto& t : trials)
        for (const auto& [key, value] : t.params)
            if (std::find(keys.begin(), keys.end(), key) == keys.end()) others.insert(key);
    keys.insert(keys.end(), others.begin(), others.end());
    return keys;
}

bool isLogParam(const core::StudyRecord& study, const std::string& key) {
    return distributionOf(study, key).find("log") != std::string::npos;
}

bool isChoiceParam(const core::StudyRecord& study, const std::string& key) {
    return distributionOf(study, key).rfind("choice", 0) == 0;
}

QColor trialStateColor(core::TrialState state) {
    switch (state) {
        case core::TrialState::Complete:
            return {0x1f, 0x77, 0xb4};
        case core::TrialState::Pruned:
            return {0xff, 0x7f, 0x0e};
        case core::TrialState::Failed:
            return {0xd6, 0x27, 0x28};
        case core::TrialState::Running:
            break;
    }
    return {0x7f, 0x7f, 0x7f};
}

QString valueText(double value) { return QString::number(value, 'g', 5); }

// ---- StudyChart -------------------------------------------------------------------------------

StudyChart::StudyChart(const QString& title, const QString& plotName, const QString& exportName,
                       QWidget* parent)
    : ChartPanel(QStringLiteral("<b>%1</b>").arg(title.toHtmlEscaped()), true,
                 tr("Save this chart as PNG or PDF"), plotName, QSize(260, 180), parent),
      m_exportName(exportName) {
    m_tracer = new QCPItemTracer(m_plot);
    m_tracer->setStyle(QCPItemTracer::tsCircle);
    m_tracer->setSize(10);
    m_tracer->setPen(QPen(Qt::black, 1.5));
    m_tracer->setBrush(Qt::NoBrush);
    m_tracer->setVisible(false);
    m_hint = makeHint(m_plot->axisRect(), kHintColor, true);
    m_hint->setVisible(false);
}

void StudyChart::rescale() {
    m_follow = true;
    fit();
    m_plot->replot();
}

void StudyChart::exportDialog() { exportWithDialog(tr("Export chart"), m_exportName); }

QString StudyChart::hoverAt(const QPointF& pos) {
    const QString text = hoverText(pos);
    showHover(pos, text, m_tracer);
    return text;
}

void StudyChart::setHint(const QString& text) {
    m_hint->setText(text);
    m_hint->setVisible(!text.isEmpty());
}

void StudyChart::placeTracer(QCPAxisRect* rect, double x, double y) {
    m_tracer->setGraph(nullptr);
    m_tracer->setClipAxisRect(rect);
    m_tracer->position->setAxes(rect->axis(QCPAxis::atBottom), rect->axis(QCPAxis::atLeft));
    m_tracer->position->setCoords(x, y);
    m_tracer->setVisible(true);
}

// ---- StudyHistoryChart ------------------------------------------------------------------------

StudyHistoryChart::StudyHistoryChart(QWidget* parent)
    : StudyChart(tr("Trials and best so far"), QStringLiteral("studyHistoryPlot"),
                 QStringLiteral("study-history.png"), parent) {
    m_plot->xAxis->setLabel(tr("trial"));
    QSharedPointer<QCPAxisTickerFixed> whole(new QCPAxisTickerFixed);
    whole->setTickStep(1);
    whole->setScaleStrategy(QCPAxisTickerFixed::ssMultiples);
    m_plot->xAxis->setTicker(whole);
    // The legend in a row of its own under the axes: inside, it would cover trials' dots.
    styleLegend();
    m_plot->axisRect()->insetLayout()->take(m_plot->legend);
    m_plot->legend->setFillOrder(QCPLayoutGrid::foColumnsFirst);
    m_plot->plotLayout()->addElement(1, 0, m_plot->legend);
    m_plot->plotLayout()->setRowStretchFactor(1, 0.001);
    clearChart({});
}

void StudyHistoryChart::clearChart(const QString& hint) {
    m_plot->clearGraphs();
    m_best = nullptr;
    m_dots.clear();
    m_tracer->setVisible(false);
    m_summary->clear();
    m_plot->legend->setVisible(false);
    setHint(hint);
    m_plot->replot();
}

void StudyHistoryChart::showDetail(const StudyDetail& d) {
    m_plot->clearGraphs();
    m_best = nullptr;
    m_dots.clear();
    m_tracer->setVisible(false);
    const std::string& direction = d.study.direction;

    // One dot series per state, in a fixed order so the legend reads the same for every study.
    for (core::TrialState state : {core::TrialState::Complete, core::TrialState::Pruned,
                                   core::TrialState::Running, core::TrialState::Failed}) {
        QVector<double> keys, values;
        for (const auto& t : d.trials) {
            if (t.state != state || !t.value || !std::isfinite(*t.value)) continue;
            keys << double(t.number);
            values << *t.value;
            QString text = tr("trial %1 · %2\n%3 = %4")
                               .arg(t.number)
                               .arg(QString::fromLatin1(core::toString(t.state)), q(d.study.objective),
                                    valueText(*t.value));
            if (t.runId > 0) text += tr("\nrun %1").arg(t.runId);
            if (!t.params.empty()) text += QLatin1Char('\n') + paramsText(t);
            m_dots.push_back({t.number, *t.value, text});
        }
        if (keys.isEmpty()) continue;
        QCPGraph* g = m_plot->addGraph();
        const QColor color = trialStateColor(state);
        g->setLineStyle(QCPGraph::lsNone);
        g->setScatterStyle(QCPScatterStyle(
            state == core::TrialState::Complete ? QCPScatterStyle::ssDisc : QCPScatterStyle::ssCircle, color,
            color, 7));
        g->setPen(QPen(color));
        g->setName(QString::fromLatin1(core::toString(state)));
        g->setData(keys, values, true);
    }

    // The best complete trial so far, as a step: a pruned trial's value is from a smaller budget
    // and is no candidate.
    QVector<double> keys, values;
    std::optional<double> best;
    int64_t last = -1;
    for (const auto& t : d.trials) {
        last = std::max(last, t.number);
        if (t.state != core::TrialState::Complete || !t.value || !std::isfinite(*t.value)) continue;
        if (best && !core::betterValue(*t.value, *best, direction)) continue;
        best = *t.value;
        keys << double(t.number);
        values << *best;
    }
    if (best) {
        if (keys.back() < double(last)) {
            keys << double(last);
            values << *best;
        }
        m_best = m_plot->addGraph();
        m_best->setLineStyle(QCPGraph::lsStepLeft);
        m_best->setPen(QPen(kBestColor, 2.0));
        m_best->setName(direction == "min" ? tr("best so far (lowest)") : tr("best so far (highest)"));
        m_best->setData(keys, values, true);
    }

    m_plot->yAxis->setLabel(q(d.study.objective));
    m_plot->legend->setVisible(m_plot->graphCount() > 0);
    if (d.study.bestValue)
        m_summary->setText(
            tr("best %1 at trial %2 (%3 %4)")
                .arg(valueText(*d.study.bestValue))
                .arg(d.study.bestTrial)
                .arg(direction == "min" ? tr("minimising") : tr("maximising"), q(d.study.objective)));
    else
        m_summary->setText(direction == "min" ? tr("minimising %1").arg(q(d.study.objective))
                                              : tr("maximising %1").arg(q(d.study.objective)));
    setHint(m_dots.empty() ? tr("No trial has a value yet") : QString());
    rescale();
}

void StudyHistoryChart::fit() {
    if (m_dots.empty()) {
        m_plot->xAxis->setRange(-0.5, 9.5);
        m_plot->yAxis->setRange(0, 1);
        return;
    }
    double x0 = std::numeric_limits<double>::max(), x1 = -x0, y0 = x0, y1 = -x0;
    for (const auto& dot : m_dots) {
        x0 = std::min(x0, double(dot.number));
        x1 = std::max(x1, double(dot.number));
        y0 = std::min(y0, dot.value);
        y1 = std::max(y1, dot.value);
    }
    if (m_best && !m_best->data()->isEmpty()) x1 = std::max(x1, (m_best->data()->constEnd() - 1)->key);
    m_plot->xAxis->setRange(x0 - 0.5, x1 + 0.5);
    m_plot->yAxis->setRange(padded(y0, y1, false));
}

QString StudyHistoryChart::hoverText(const QPointF& pos) {
    const Dot* nearest = nullptr;
    double bestDist = kHoverRadiusPx;
    for (const auto& dot : m_dots) {
        const double dx = m_plot->xAxis->coordToPixel(double(dot.number)) - pos.x();
        const double dy = m_plot->yAxis->coordToPixel(dot.value) - pos.y();
        const double dist = std::hypot(dx, dy);
        if (dist <= bestDist) {
            bestDist = dist;
            nearest = &dot;
        }
    }
    if (!nearest) return {};
    placeTracer(m_plot->axisRect(), double(nearest->number), nearest->value);
    return nearest->text;
}

// ---- ParallelCoordinatesChart -----------------------------------------------------------------

ParallelCoordinatesChart::ParallelCoordinatesChart(QWidget* parent)
    : StudyChart(tr("Parallel coordinates"), QStringLiteral("studyParallelPlot"),
                 QStringLiteral("study-parallel.png"), parent) {
    // Fixed axes: panning or zooming a parallel-coordinates plot shows nothing new.
    m_plot->setInteractions(QCP::Interactions());
    m_plot->yAxis->setTickLabels(false);
    m_plot->yAxis->setTicks(false);
    m_plot->yAxis->grid()->setVisible(false);
    m_plot->xAxis->grid()->setVisible(false);
    // The parameters' names as tick labels, without the tick marks (the axes are drawn as lines).
    m_plot->xAxis->setTickLength(0, 0);
    m_plot->xAxis->setSubTicks(false);
    m_plot->xAxis->setBasePen(Qt::NoPen);
    m_plot->yAxis->setBasePen(Qt::NoPen);

    m_scale = new QCPColorScale(m_plot);
    m_plot->plotLayout()->addElement(0, 1, m_scale);
    m_scale->setType(QCPAxis::atRight);
    m_scale->setBarWidth(10);
    m_scale->setRangeDrag(false);
    m_scale->setRangeZoom(false);
    auto* margins = new QCPMarginGroup(m_plot);
    m_plot->axisRect()->setMarginGroup(QCP::msTop | QCP::msBottom, margins);
    m_scale->setMarginGroup(QCP::msTop | QCP::msBottom, margins);
    clearChart({});
}

void ParallelCoordinatesChart::clearAxes() {
    for (QCPAbstractItem* item : m_axisItems) m_plot->removeItem(item);
    m_axisItems.clear();
}

void ParallelCoordinatesChart::clearChart(const QString& hint) {
    m_plot->clearGraphs();
    clearAxes();
    m_keys.clear();
    m_lines.clear();
    m_tracer->setVisible(false);
    m_summary->clear();
    m_scale->setVisible(false);
    m_plot->xAxis->setTicker(QSharedPointer<QCPAxisTickerText>(new QCPAxisTickerText));
    setHint(hint);
    fit();
    m_plot->replot();
}

void ParallelCoordinatesChart::showDetail(const StudyDetail& d) {
    m_plot->clearGraphs();
    clearAxes();
    m_lines.clear();
    m_tracer->setVisible(false);

    std::vector<const core::TrialRecord*> trials;
    for (const auto& t : d.trials)
        if (t.value && std::isfinite(*t.value)) trials.push_back(&t);
    const std::vector<std::string> params = studyParamKeys(d.study, d.trials);
    m_keys = params;
    m_keys.push_back(d.study.objective);
    const size_t axes = m_keys.size();
    for (const auto* t : trials) {
        Line line;
        line.number = t->number;
        line.y.assign(axes, kNaN);
        line.values.assign(axes, QString());
        m_lines.push_back(std::move(line));
    }

    QFont small = font();
    small.setPointSizeF(std::max(7.0, small.pointSizeF() - 1.5));
    auto label = [&](double x, double y, const QString& text, Qt::Alignment align) {
        auto* item = new QCPItemText(m_plot);
        item->position->setCoords(x, y);
        item->setPositionAlignment(align);
        item->setText(text);
        item->setFont(small);
        item->setColor(kAxisColor);
        item->setBrush(QColor(255, 255, 255, 190));
        item->setPadding(QMargins(2, 0, 2, 0));
        item->setClipToAxisRect(false);
        item->setLayer(QStringLiteral("axes"));  // above the lines
        m_axisItems.push_back(item);
    };

    QSharedPointer<QCPAxisTickerText> names(new QCPAxisTickerText);
    for (size_t a = 0; a < axes; ++a) {
        const bool objective = a + 1 == axes;
        const std::string& key = m_keys[a];
        const double x = double(a);
        std::vector<std::string> raw(trials.size());
        std::vector<bool> present(trials.size(), false);
        for (size_t i = 0; i < trials.size(); ++i) {
            if (objective) {
                raw[i] = valueText(*trials[i]->value).toStdString();
                present[i] = true;
                continue;
            }
            const auto it = trials[i]->params.find(key);
            if (it == trials[i]->params.end()) continue;
            raw[i] = it->second;
            present[i] = true;
        }
        std::vector<double> num(trials.size(), kNaN);
        bool numeric = objective || !isChoiceParam(d.study, key);
        for (size_t i = 0; i < trials.size() && numeric; ++i) {
            if (objective)
                num[i] = *trials[i]->value;
            else if (present[i])
                numeric = parseNumber(raw[i], num[i]);
        }
        const bool log = numeric && !objective && isLogParam(d.study, key) &&
                         std::all_of(num.begin(), num.end(), [](double v) { return std::isnan(v) || v > 0; });
        QString title = objective ? q(key) : log ? tr("%1 (log)").arg(q(key)) : q(key);
        names->addTick(x, title);

        if (numeric) {
            double lo = std::numeric_limits<double>::max(), hi = -lo;
            for (double v : num)
                if (!std::isnan(v)) {
                    const double s = log ? std::log(v) : v;
                    lo = std::min(lo, s);
                    hi = std::max(hi, s);
                }
            for (size_t i = 0; i < trials.size(); ++i) {
                if (std::isnan(num[i])) continue;
                const double s = log ? std::log(num[i]) : num[i];
                m_lines[i].y[a] = hi > lo ? (s - lo) / (hi - lo) : 0.5;
                m_lines[i].values[a] = q(raw[i]);
            }
            if (lo <= hi) {
                const auto back = [&](double s) { return valueText(log ? std::exp(s) : s); };
                if (hi > lo) {
                    label(x, 0, back(lo), Qt::AlignLeft | Qt::AlignVCenter);
                    label(x, 1, back(hi), Qt::AlignLeft | Qt::AlignVCenter);
                } else {
                    label(x, 0.5, back(lo), Qt::AlignLeft | Qt::AlignVCenter);
                }
            }
        } else {
            // Choices spread evenly, in numeric order when they are numbers.
            std::vector<std::string> choices;
            for (size_t i = 0; i < trials.size(); ++i)
                if (present[i] && std::find(choices.begin(), choices.end(), raw[i]) == choices.end())
                    choices.push_back(raw[i]);
            std::vector<double> asNumber(choices.size());
            bool allNumbers = true;
            for (size_t c = 0; c < choices.size() && allNumbers; ++c)
                allNumbers = parseNumber(choices[c], asNumber[c]);
            std::vector<size_t> order(choices.size());
            for (size_t c = 0; c < order.size(); ++c) order[c] = c;
            std::sort(order.begin(), order.end(), [&](size_t l, size_t r) {
                return allNumbers ? asNumber[l] < asNumber[r] : choices[l] < choices[r];
            });
            std::map<std::string, double> yOf;
            for (size_t rank = 0; rank < order.size(); ++rank) {
                const double y = order.size() > 1 ? double(rank) / double(order.size() - 1) : 0.5;
                yOf[choices[order[rank]]] = y;
                label(x, y, q(choices[order[rank]]), Qt::AlignLeft | Qt::AlignVCenter);
            }
            for (size_t i = 0; i < trials.size(); ++i)
                if (present[i]) {
                    m_lines[i].y[a] = yOf[raw[i]];
                    m_lines[i].values[a] = q(raw[i]);
                }
        }
        auto* axisLine = new QCPItemLine(m_plot);
        axisLine->start->setCoords(x, 0);
        axisLine->end->setCoords(x, 1);
        axisLine->setPen(QPen(kAxisColor, 1.2));
        axisLine->setLayer(QStringLiteral("grid"));
        m_axisItems.push_back(axisLine);
    }
    m_plot->xAxis->setTicker(names);

    // Colour by the objective, brightest for the best; the best lines drawn last, on top.
    double lo = std::numeric_limits<double>::max(), hi = -lo;
    for (const auto* t : trials) {
        lo = std::min(lo, *t->value);
        hi = std::max(hi, *t->value);
    }
    const bool minimise = d.study.direction == "min";
    QCPColorGradient gradient = minimise ? viridis().inverted() : viridis();
    const QCPRange range = trials.empty() ? QCPRange(0, 1) : nonEmpty(lo, hi);
    std::vector<size_t> drawOrder(trials.size());
    for (size_t i = 0; i < drawOrder.size(); ++i) drawOrder[i] = i;
    std::stable_sort(drawOrder.begin(), drawOrder.end(), [&](size_t l, size_t r) {
        return core::betterValue(*trials[r]->value, *trials[l]->value, d.study.direction);
    });
    QVector<double> xs(static_cast<qsizetype>(axes));
    for (size_t a = 0; a < axes; ++a) xs[qsizetype(a)] = double(a);
    for (size_t i : drawOrder) {
        QCPGraph* g = m_plot->addGraph();
        QColor color = QColor::fromRgb(gradient.color(*trials[i]->value, range));
        color.setAlpha(215);
        QPen pen(color, 1.6);
        // A pruned trial's value is from a smaller budget: dashed, to be read with care.
        if (trials[i]->state == core::TrialState::Pruned) pen.setStyle(Qt::DashLine);
        g->setPen(pen);
        g->setName(tr("trial %1").arg(trials[i]->number));
        // NaN leaves a gap where the trial has no value for a parameter.
        g->setData(xs, QVector<double>(m_lines[i].y.begin(), m_lines[i].y.end()), true);
    }

    m_scale->setGradient(gradient);
    m_scale->setDataRange(range);
    m_scale->axis()->setLabel(q(d.study.objective));
    m_scale->setVisible(!trials.empty());
    m_summary->setText(trials.empty()
                           ? QString()
                           : tr("%n trial(s) with a value; dashed: pruned", nullptr, int(trials.size())));
    setHint(trials.empty() ? tr("No trial has a value yet") : QString());
    rescale();
}

void ParallelCoordinatesChart::fit() {
    const double axes = std::max<double>(1, double(m_keys.size()));
    // Room right of the last axis for its labels.
    m_plot->xAxis->setRange(-0.15, axes - 1 + 0.45);
    m_plot->yAxis->setRange(-0.06, 1.06);
}

QString ParallelCoordinatesChart::hoverText(const QPointF& pos) {
    if (m_lines.empty() || m_keys.empty()) return {};
    const long a = std::lround(m_plot->xAxis->pixelToCoord(pos.x()));
    if (a < 0 || size_t(a) >= m_keys.size()) return {};
    const Line* nearest = nullptr;
    double bestDist = kHoverRadiusPx;
    for (const auto& line : m_lines) {
        const double y = line.y[size_t(a)];
        if (std::isnan(y)) continue;
        const double dist = std::hypot(m_plot->xAxis->coordToPixel(double(a)) - pos.x(),
                                       m_plot->yAxis->coordToPixel(y) - pos.y());
        if (dist <= bestDist) {
            bestDist = dist;
            nearest = &line;
        }
    }
    if (!nearest) return {};
    placeTracer(m_plot->axisRect(), double(a), nearest->y[size_t(a)]);
    QString text = tr("trial %1").arg(nearest->number);
    for (size_t k = 0; k < m_keys.size(); ++k)
        text +=
            QStringLiteral("\n%1 = %2")
                .arg(q(m_keys[k]), nearest->values[k].isEmpty() ? QStringLiteral("–") : nearest->values[k]);
    return text;
}

// ---- ImportanceChart --------------------------------------------------------------------------

ImportanceChart::ImportanceChart(QWidget* parent)
    : StudyChart(tr("Parameter importance"), QStringLiteral("studyImportancePlot"),
                 QStringLiteral("study-importance.png"), parent) {
    m_plot->setInteractions(QCP::Interactions());
    // Horizontal bars: the parameters along the left axis.
    m_bars = new QCPBars(m_plot->yAxis, m_plot->xAxis);
    m_bars->setWidth(0.6);
    m_bars->setPen(QPen(kBarColor));
    m_bars->setBrush(QColor(kBarColor.red(), kBarColor.green(), kBarColor.blue(), 170));
    m_bars->setName(tr("importance"));
    m_plot->xAxis->setLabel(tr("share of the objective's explained variation"));
    m_plot->yAxis->grid()->setVisible(false);
    clearChart({});
}

void ImportanceChart::clearChart(const QString& hint) {
    m_bars->data()->clear();
    m_shown.clear();
    for (QCPAbstractItem* item : m_labels) m_plot->removeItem(item);
    m_labels.clear();
    m_tracer->setVisible(false);
    m_summary->clear();
    m_plot->yAxis->setTicker(QSharedPointer<QCPAxisTickerText>(new QCPAxisTickerText));
    setHint(hint);
    fit();
    m_plot->replot();
}

void ImportanceChart::showDetail(const StudyDetail& d) {
    int withValues = 0;
    for (const auto& t : d.trials)
        if (t.state == core::TrialState::Complete && t.value && std::isfinite(*t.value)) ++withValues;
    clearChart(d.importance.empty() ? tr("Needs 4 complete trials (%n so far)", nullptr, withValues)
                                    : QString());
    m_shown = d.importance;
    QSharedPointer<QCPAxisTickerText> names(new QCPAxisTickerText);
    const size_t n = m_shown.size();
    double total = 0;
    for (size_t i = 0; i < n; ++i) {
        const double key = double(n - i);  // the most important on top
        m_bars->addData(key, m_shown[i].importance);
        names->addTick(key, q(m_shown[i].key));
        total += m_shown[i].importance;
        auto* text = new QCPItemText(m_plot);
        text->position->setCoords(m_shown[i].importance, key);  // (bottom axis, left axis)
        text->setPositionAlignment(Qt::AlignLeft | Qt::AlignVCenter);
        text->setPadding(QMargins(4, 0, 0, 0));
        text->setText(QStringLiteral("%1 %").arg(m_shown[i].importance * 100, 0, 'f', 1));
        text->setColor(kAxisColor);
        m_labels.push_back(text);
    }
    m_plot->yAxis->setTicker(names);
    if (n > 0 && total == 0) setHint(tr("The objective did not vary: nothing to explain"));
    if (n > 0 && total > 0)
        m_summary->setText(tr("%1 explains the most (%2 %)")
                               .arg(q(m_shown.front().key))
                               .arg(m_shown.front().importance * 100, 0, 'f', 0));
    rescale();
}

void ImportanceChart::fit() {
    double top = 0;
    for (const auto& p : m_shown) top = std::max(top, p.importance);
    // Room for the percentages right of the longest bar.
    m_plot->xAxis->setRange(0, top > 0 ? std::min(1.0, top) * 1.22 : 1.0);
    m_plot->yAxis->setRange(0.4, double(std::max<size_t>(1, m_shown.size())) + 0.6);
}

QString ImportanceChart::hoverText(const QPointF& pos) {
    const size_t n = m_shown.size();
    if (n == 0 || !m_plot->axisRect()->rect().contains(pos.toPoint())) return {};
    const long key = std::lround(m_plot->yAxis->pixelToCoord(pos.y()));
    if (key < 1 || size_t(key) > n) return {};
    const auto& p = m_shown[n - size_t(key)];
    placeTracer(m_plot->axisRect(), p.importance, double(key));
    return tr("%1: %2 % of the objective's variation the parameters explain\n"
              "(the variance between trials with similar %1, as a share of the total)")
        .arg(q(p.key))
        .arg(p.importance * 100, 0, 'f', 1);
}

// ---- PpoChoicesChart --------------------------------------------------------------------------

PpoChoicesChart::PpoChoicesChart(QWidget* parent)
    : StudyChart(tr("What the PPO agent chose"), QStringLiteral("studyPpoPlot"),
                 QStringLiteral("study-ppo.png"), parent) {
    const auto rects = stackStepRects({1, 1});
    m_lrRect = rects[0];
    m_batchRect = rects[1];
    QCPAxis* lr = m_lrRect->axis(QCPAxis::atLeft);
    lr->setLabel(QStringLiteral("ppo/lr"));
    lr->setScaleType(QCPAxis::stLogarithmic);
    lr->setTicker(QSharedPointer<QCPAxisTickerLog>(new QCPAxisTickerLog));
    lr->setNumberFormat(QStringLiteral("eb"));
    lr->setNumberPrecision(0);
    m_batchRect->axis(QCPAxis::atLeft)->setLabel(QStringLiteral("ppo/batch"));
    clearChart({});
}

int PpoChoicesChart::lineCount(bool batch) const {
    QCPAxis* axis = (batch ? m_batchRect : m_lrRect)->axis(QCPAxis::atLeft);
    int n = 0;
    for (const auto& line : m_lines)
        if (line.graph->valueAxis() == axis && !line.graph->data()->isEmpty()) ++n;
    return n;
}

void PpoChoicesChart::clearChart(const QString& hint) {
    m_plot->clearGraphs();
    m_lines.clear();
    m_tracer->setVisible(false);
    m_summary->clear();
    setHint(hint);
    fit();
    m_plot->replot();
}

void PpoChoicesChart::showDetail(const StudyDetail& d) {
    clearChart({});
    if (d.ppo.empty()) {
        setHint(tr("No ppo/lr or ppo/batch points in the trials' runs yet"));
        m_plot->replot();
        return;
    }
    // Colour by trial number: dark for the first trials, light for the last (what the agent
    // learned shows as a drift of colour).
    int64_t first = d.ppo.front().trialNumber, last = first;
    for (const auto& s : d.ppo) {
        first = std::min(first, s.trialNumber);
        last = std::max(last, s.trialNumber);
    }
    QCPColorGradient gradient = viridis();
    const QCPRange range = nonEmpty(double(first), double(last));
    for (const auto& s : d.ppo) {
        QColor color = QColor::fromRgb(gradient.color(double(s.trialNumber), range));
        for (bool batch : {false, true}) {
            const auto& points = batch ? s.batch : s.lr;
            QVector<double> keys, values;
            for (const auto& p : points) {
                if (!std::isfinite(p.value) || (!batch && p.value <= 0)) continue;  // log axis
                keys << double(p.step);
                values << p.value;
            }
            if (keys.isEmpty()) continue;
            QCPAxisRect* rect = batch ? m_batchRect : m_lrRect;
            QCPGraph* g = m_plot->addGraph(rect->axis(QCPAxis::atBottom), rect->axis(QCPAxis::atLeft));
            g->setPen(QPen(color, 1.6));
            // The agent changes them at intervals: a step holds until the next choice. Dots for the
            // choices themselves (a trial that failed at once has a single one).
            g->setLineStyle(QCPGraph::lsStepLeft);
            g->setScatterStyle(QCPScatterStyle(QCPScatterStyle::ssDisc, color, color, 4));
            g->setName(tr("trial %1").arg(s.trialNumber));
            g->setData(keys, values);
            m_lines.push_back({g, s.trialNumber, s.runId});
        }
    }
    m_summary->setText(
        tr("%n trial(s); colour: trial number, dark (first) → light (last)", nullptr, int(d.ppo.size())));
    if (m_lines.empty()) setHint(tr("No ppo/lr or ppo/batch points in the trials' runs yet"));
    rescale();
}

void PpoChoicesChart::fit() {
    for (QCPAxisRect* rect : {m_lrRect, m_batchRect}) {
        const bool log = rect == m_lrRect;
        double y0 = std::numeric_limits<double>::max(), y1 = -y0;
        for (const auto& line : m_lines) {
            if (line.graph->valueAxis() != rect->axis(QCPAxis::atLeft)) continue;
            for (auto it = line.graph->data()->constBegin(); it != line.graph->data()->constEnd(); ++it) {
                y0 = std::min(y0, it->value);
                y1 = std::max(y1, it->value);
            }
        }
        if (y0 > y1) {
            rect->axis(QCPAxis::atLeft)->setRange(log ? QCPRange(1e-4, 1e-1) : QCPRange(0, 1));
            continue;
        }
        rect->axis(QCPAxis::atLeft)->setRange(padded(y0, y1, log));
    }
    // The step axes are linked: setting one sets both, to the steps of all lines.
    double x0 = std::numeric_limits<double>::max(), x1 = -x0;
    for (const auto& line : m_lines)
        if (!line.graph->data()->isEmpty()) {
            x0 = std::min(x0, line.graph->data()->constBegin()->key);
            x1 = std::max(x1, (line.graph->data()->constEnd() - 1)->key);
        }
    m_batchRect->axis(QCPAxis::atBottom)->setRange(x0 <= x1 ? padded(x0, x1, false) : QCPRange(0, 1));
}

QString PpoChoicesChart::hoverText(const QPointF& pos) {
    for (QCPAxisRect* rect : {m_lrRect, m_batchRect}) {
        if (!rect->rect().contains(pos.toPoint())) continue;
        QCPAxis* x = rect->axis(QCPAxis::atBottom);
        QCPAxis* y = rect->axis(QCPAxis::atLeft);
        const double key = x->pixelToCoord(pos.x());
        // The step each line holds at the pointer's step (the last choice at or before it).
        const Line* nearest = nullptr;
        double value = 0, bestDist = kHoverRadiusPx;
        for (const auto& line : m_lines) {
            const auto& data = line.graph->data();
            if (line.graph->valueAxis() != y || data->isEmpty()) continue;
            if (key < data->constBegin()->key - 0.5 || key > (data->constEnd() - 1)->key + 0.5) continue;
            auto it = data->findEnd(key, false);
            if (it != data->constBegin()) --it;
            const double dist = std::abs(y->coordToPixel(it->value) - pos.y());
            if (dist <= bestDist) {
                bestDist = dist;
                nearest = &line;
                value = it->value;
            }
        }
        if (!nearest) return {};
        placeTracer(rect, key, value);
        return tr("trial %1 (run %2), step %3\n%4 = %5")
            .arg(nearest->trialNumber)
            .arg(nearest->runId)
            .arg(qint64(std::llround(key)))
            .arg(rect == m_lrRect ? QStringLiteral("ppo/lr") : QStringLiteral("ppo/batch"), valueText(value));
    }
    return {};
}

}  // namespace lathe::widgets
