#include "lathe/widgets/dashboard.h"

#include <QComboBox>
#include <QElapsedTimer>
#include <QFileInfo>
#include <QHBoxLayout>
#include <QImage>
#include <QLabel>
#include <QLocale>
#include <QPageSize>
#include <QPdfWriter>
#include <QSplitter>
#include <QVBoxLayout>

#include <algorithm>
#include <cmath>
#include <limits>

#include "lathe/widgets/metric_chart.h"
#include "lathe/widgets/qcustomplot_include.h"
#include "lathe/widgets/run_overlay.h"

namespace lathe::widgets {

namespace {

std::string lastSegment(const std::string& key) {
    const auto slash = key.rfind('/');
    return slash == std::string::npos ? key : key.substr(slash + 1);
}

bool endsWith(const std::string& s, const std::string& suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Which chart plots a key: 0 loss, 1 accuracy, -1 neither (a pure function: workers call it).
int chartIndexOf(const std::string& key) {
    const std::string last = lastSegment(key);
    if (endsWith(last, "loss")) return 0;
    if (last.find("acc") != std::string::npos) return 1;
    return -1;
}

// A dark-to-warm ramp (after matplotlib's plasma, stopped before its pale yellow, which would
// vanish on white when drawn faint): t in [0, 1].
QRgb ramp(double t) {
    static const QRgb stops[] = {qRgb(0x0d, 0x08, 0x87), qRgb(0x7e, 0x03, 0xa8), qRgb(0xcc, 0x47, 0x78),
                                 qRgb(0xf4, 0x88, 0x49)};
    t = std::clamp(t, 0.0, 1.0) * 3.0;
    const int i = std::min(2, int(t));
    const double f = t - i;
    auto mix = [f](int a, int b) { return int(std::lround(a + (b - a) * f)); };
    return qRgb(mix(qRed(stops[i]), qRed(stops[i + 1])), mix(qGreen(stops[i]), qGreen(stops[i + 1])),
                mix(qBlue(stops[i]), qBlue(stops[i + 1])));
}

constexpr QRgb kMissing = qRgb(0xa0, 0xa0, 0xa0);

// The Tableau 10 colours MetricChart gives single runs, for parameters with few values.
const QRgb kCategories[] = {0x1f77b4, 0xff7f0e, 0x2ca02c, 0xd62728, 0x9467bd,
                            0x8c564b, 0xe377c2, 0x7f7f7f, 0xbcbd22, 0x17becf};

std::string fmt(double v) { return QString::number(v, 'g', 4).toStdString(); }

}  // namespace

Dashboard::Dashboard(QWidget* parent) : QWidget(parent) {
    auto* layout = new QVBoxLayout(this);
    layout->setContentsMargins(0, 0, 0, 0);
    m_loadPool.setMaxThreadCount(1);
    // Shown only while runs are overlaid: what their colour means.
    m_overlayBar = new QWidget(this);
    auto* bar = new QHBoxLayout(m_overlayBar);
    bar->setContentsMargins(6, 2, 6, 0);
    bar->addWidget(new QLabel(tr("Colour overlaid runs by"), m_overlayBar));
    m_colorBy = new QComboBox(m_overlayBar);
    m_colorBy->setObjectName(QStringLiteral("colorBy"));
    m_colorBy->setToolTip(
        tr("Colour each overlaid run by a parameter (blue: lowest, orange: highest; "
           "grey: runs without it) or by its place in the selection"));
    m_colorBy->setSizeAdjustPolicy(QComboBox::AdjustToContents);
    bar->addWidget(m_colorBy);
    bar->addStretch(1);
    m_overlayBar->setVisible(false);
    layout->addWidget(m_overlayBar);
    connect(m_colorBy, &QComboBox::currentIndexChanged, this, [this] {
        m_colorKey = m_colorBy->currentData().toString();
        applyOverlayColors();
    });
    auto* split = new QSplitter(Qt::Vertical, this);
    m_loss = new MetricChart(tr("loss"), {QStringLiteral("train/loss"), QStringLiteral("val/loss")}, split);
    m_loss->setObjectName(QStringLiteral("lossChart"));
    m_accuracy = new MetricChart(tr("accuracy"),
                                 {QStringLiteral("train/accuracy"), QStringLiteral("val/accuracy")}, split);
    m_accuracy->setObjectName(QStringLiteral("accuracyChart"));
    // Accuracy rises towards the top right, so its legend goes where the curves are not.
    m_accuracy->setLegendAlignment(Qt::AlignBottom | Qt::AlignRight);
    split->addWidget(m_loss);
    split->addWidget(m_accuracy);
    split->setChildrenCollapsible(false);
    layout->addWidget(split);
}

Dashboard::~Dashboard() {
    ++m_loadGeneration;  // a load in flight stops at its next series
    m_loadPool.waitForDone();
}

QString Dashboard::tabTitle() const { return tr("Curves"); }

MetricChart* Dashboard::chartFor(const std::string& key) const {
    switch (chartIndexOf(key)) {
        case 0:
            return m_loss;
        case 1:
            return m_accuracy;
        default:
            return nullptr;
    }
}

void Dashboard::clear() {
    ++m_loadGeneration;
    m_overlayLoading = false;
    m_lossOverlay.reset();
    m_accuracyOverlay.reset();
    m_overlayRuns.clear();
    m_overlayParams.clear();
    {
        const QSignalBlocker block(m_colorBy);  // m_colorKey keeps the choice for the next overlay
        m_colorBy->clear();
        m_colorBy->addItem(tr("run"), QString());
    }
    m_overlayBar->setVisible(false);
    m_shown.clear();
    m_lastStep.clear();
    m_loss->clear();
    m_accuracy->clear();
}

void Dashboard::showRuns(const core::Store& store, const std::vector<int64_t>& runIds) {
    clear();
    std::vector<int64_t> unique;
    for (int64_t runId : runIds)
        if (m_shown.insert(runId).second) unique.push_back(runId);
    if (unique.size() <= kOverlayAbove) {
        for (int64_t runId : unique) plotFromStore(store, runId);
        return;
    }
    // Runs with live points are graphs on top (they grow); the rest is one overlay.
    std::set<int64_t> live;
    for (const auto& [series, points] : m_live)
        if (!points.empty()) live.insert(series.first);
    std::vector<int64_t> overlay;
    for (int64_t runId : unique) {
        if (live.count(runId))
            plotFromStore(store, runId);
        else
            overlay.push_back(runId);
    }
    loadOverlay(store.path(), std::move(overlay));
}

void Dashboard::loadOverlay(const std::string& path, std::vector<int64_t> runIds) {
    const uint64_t generation = ++m_loadGeneration;
    m_overlayRuns = runIds;
    m_overlayLoading = true;
    const QString loading = tr("loading %1 runs…").arg(QLocale().toString(qlonglong(runIds.size())));
    m_loss->setOverlayStatus(loading);
    m_accuracy->setOverlayStatus(loading);
    const QStringList lossKeys = m_loss->keys(), accuracyKeys = m_accuracy->keys();
    // The pool is waited for in the destructor, so `this` outlives the task; a queued call to a
    // deleted object is discarded by Qt. Only m_loadGeneration (atomic) is read over there.
    m_loadPool.start([this, path, runIds = std::move(runIds), generation, lossKeys, accuracyKeys] {
        auto current = [&] { return m_loadGeneration.load() == generation; };
        auto loss = std::make_shared<OverlayData>(), accuracy = std::make_shared<OverlayData>();
        Params params;
        QString error;
        std::vector<int64_t> unpacked;
        QElapsedTimer sinceReport;
        sinceReport.start();
        const QString total = QLocale().toString(qlonglong(runIds.size()));
        // Called by the reading thread now and then: stops a superseded load, reports progress.
        auto keepGoing = [&](double done) {
            if (!current()) return false;
            if (sinceReport.elapsed() >= 100) {
                sinceReport.restart();
                const QString text = tr("loading %1 runs… %2%").arg(total).arg(int(done * 100));
                QMetaObject::invokeMethod(
                    this,
                    [this, generation, text] {
                        if (generation != m_loadGeneration.load()) return;
                        m_loss->setOverlayStatus(text);
                        m_accuracy->setOverlayStatus(text);
                    },
                    Qt::QueuedConnection);
            }
            return true;
        };
        try {
            core::Store::readSeries(
                path, runIds, [](const std::string& key) { return chartIndexOf(key) >= 0; },
                [&](core::Store::Series&& s) {
                    if (!current()) return false;
                    const int chart = chartIndexOf(s.key);
                    const QStringList& keys = chart == 0 ? lossKeys : accuracyKeys;
                    OverlayCurve c;
                    c.runId = s.runId;
                    c.style = !keys.isEmpty() && keys.front().toStdString() == s.key ? 0 : 1;
                    c.key = std::move(s.key);
                    c.x = std::move(s.steps);
                    c.y = std::move(s.values);
                    (chart == 0 ? loss : accuracy)->curves.push_back(std::move(c));
                    return true;
                },
                keepGoing, &unpacked);
            if (current()) params = core::Store::readParams(path, runIds);
        } catch (const std::exception& e) {
            error = QString::fromUtf8(e.what());
        }
        if (!current()) return;
        loss->finish();
        accuracy->finish();
        QList<qint64> toPack(unpacked.begin(), unpacked.end());
        QMetaObject::invokeMethod(
            this,
            [this, generation, loss, accuracy, params = std::move(params), error, path, toPack] {
                if (generation != m_loadGeneration.load()) return;
                m_overlayLoading = false;
                if (!toPack.isEmpty() && error.isEmpty())
                    Q_EMIT runsUnpacked(QString::fromStdString(path), toPack);
                if (!error.isEmpty()) {
                    const QString text = tr("could not load the runs: %1").arg(error);
                    m_loss->setOverlayStatus(text);
                    m_accuracy->setOverlayStatus(text);
                    return;
                }
                m_lossOverlay = loss;
                m_accuracyOverlay = accuracy;
                m_overlayParams = params;
                // The parameters that tell the runs apart, for the colour selector.
                std::map<std::string, std::set<std::string>> values;
                for (const auto& [run, kv] : m_overlayParams)
                    for (const auto& [k, v] : kv) values[k].insert(v);
                const QString previous = m_colorKey;
                {
                    const QSignalBlocker block(m_colorBy);
                    m_colorBy->clear();
                    m_colorBy->addItem(tr("run"), QString());
                    for (const auto& [k, vs] : values)
                        if (vs.size() > 1)
                            m_colorBy->addItem(QString::fromStdString(k), QString::fromStdString(k));
                    const int keep = m_colorBy->findData(previous);
                    m_colorBy->setCurrentIndex(keep >= 0 ? keep : 0);
                }
                m_overlayBar->setVisible(true);
                m_loss->setOverlayStatus({});
                m_accuracy->setOverlayStatus({});
                applyOverlayColors();
                Q_EMIT overlayLoaded();
            },
            Qt::QueuedConnection);
    });
}

QStringList Dashboard::overlayColorKeys() const {
    QStringList keys;
    for (int i = 1; i < m_colorBy->count(); ++i) keys << m_colorBy->itemData(i).toString();
    return keys;
}

bool Dashboard::setOverlayColorKey(const QString& key) {
    const int i = m_colorBy->findData(key);
    if (i < 0) return false;
    m_colorBy->setCurrentIndex(i);  // a change colours the overlay (currentIndexChanged)
    return true;
}

void Dashboard::applyOverlayColors() {
    if (!m_lossOverlay || !m_accuracyOverlay) return;
    const std::string key = m_colorBy->currentData().toString().toStdString();
    const QLocale locale;
    std::map<int64_t, QRgb> colorOf;
    QString legend;
    const auto n = m_overlayRuns.size();
    if (key.empty()) {
        for (size_t i = 0; i < n; ++i)
            colorOf[m_overlayRuns[i]] = ramp(n > 1 ? double(i) / double(n - 1) : 0.0);
        legend = n ? tr("colour: run, %1 (blue) → %2 (orange), in the order selected")
                         .arg(m_overlayRuns.front())
                         .arg(m_overlayRuns.back())
                   : QString();
    } else {
        // Numbers on a linear scale, or a log scale when they are positive and span over 100×;
        // anything else by category.
        std::map<int64_t, std::string> raw;
        for (const auto& [run, kv] : m_overlayParams)
            if (auto it = kv.find(key); it != kv.end()) raw[run] = it->second;
        std::map<int64_t, double> num;
        bool numeric = !raw.empty();
        for (const auto& [run, v] : raw) {
            char* end = nullptr;
            const double d = std::strtod(v.c_str(), &end);
            if (end == v.c_str() || *end != '\0' || !std::isfinite(d)) {
                numeric = false;
                break;
            }
            num[run] = d;
        }
        if (numeric) {
            double lo = std::numeric_limits<double>::infinity(), hi = -lo;
            for (const auto& [run, d] : num) lo = std::min(lo, d), hi = std::max(hi, d);
            const bool logScale = lo > 0 && hi / lo > 100;
            auto pos = [&](double d) {
                if (hi <= lo) return 0.5;
                return logScale ? std::log(d / lo) / std::log(hi / lo) : (d - lo) / (hi - lo);
            };
            for (const auto& [run, d] : num) colorOf[run] = ramp(pos(d));
            legend = tr("colour: %1, %2 (blue) → %3 (orange)%4")
                         .arg(QString::fromStdString(key), QString::fromStdString(fmt(lo)),
                              QString::fromStdString(fmt(hi)), logScale ? tr(", log scale") : QString());
        } else {
            std::set<std::string> distinct;
            for (const auto& [run, v] : raw) distinct.insert(v);
            std::map<std::string, size_t> rank;
            for (const auto& v : distinct) rank.emplace(v, rank.size());
            const size_t k = distinct.size();
            for (const auto& [run, v] : raw)
                colorOf[run] = k <= std::size(kCategories)
                                   ? kCategories[rank[v]]
                                   : ramp(k > 1 ? double(rank[v]) / double(k - 1) : 0.0);
            QStringList names;
            for (const auto& v : distinct) {
                if (names.size() == 6) {
                    names << tr("… %1 values").arg(k);
                    break;
                }
                names << QString::fromStdString(v);
            }
            legend = tr("colour: %1 (%2)").arg(QString::fromStdString(key), names.join(QStringLiteral(", ")));
        }
        if (raw.size() < n)
            legend += tr("; grey: %1 runs without it").arg(locale.toString(qlonglong(n - raw.size())));
    }
    auto colorsFor = [&](const OverlayData& d) {
        std::vector<QRgb> colors;
        colors.reserve(d.curves.size());
        for (const auto& c : d.curves) {
            auto it = colorOf.find(c.runId);
            colors.push_back(it == colorOf.end() ? kMissing : it->second);
        }
        return colors;
    };
    const QString runs = tr("%1 runs overlaid").arg(locale.toString(qlonglong(n)));
    auto note = [&](const OverlayData& d) {
        return QStringLiteral("%1 · %2 points · %3").arg(runs, locale.toString(qlonglong(d.points)), legend);
    };
    for (auto [chart, data] : {std::pair{m_loss, m_lossOverlay}, std::pair{m_accuracy, m_accuracyOverlay}}) {
        if (data->curves.empty()) {  // none of the runs has this chart's keys
            chart->clearOverlay();
            chart->setOverlayStatus(tr("%1 · none has %2 curves").arg(runs, chart->title()));
        } else if (chart->overlayData() == data.get()) {
            chart->setOverlayColors(colorsFor(*data), note(*data));
        } else {
            chart->setOverlay(data, colorsFor(*data), note(*data));
        }
    }
}

void Dashboard::plotFromStore(const core::Store& store, int64_t runId) {
    for (const std::string& key : store.metricKeys(runId)) {
        MetricChart* chart = chartFor(key);
        if (!chart) continue;
        std::vector<core::MetricPoint> points = store.metrics(runId, key);
        // Top up with live points the store writer has not committed yet.
        auto live = m_live.find({runId, key});
        if (live != m_live.end()) {
            const int64_t last = points.empty() ? std::numeric_limits<int64_t>::min() : points.back().step;
            for (const auto& p : live->second)
                if (p.step > last) points.push_back(p);
        }
        chart->setSeries(runId, key, points);
        m_lastStep[{runId, key}] = points.empty() ? std::numeric_limits<int64_t>::min() : points.back().step;
    }
    // A live run whose keys are not in the store yet still shows what arrived.
    for (const auto& [series, points] : m_live) {
        if (series.first != runId || m_lastStep.count(series) || points.empty()) continue;
        if (MetricChart* chart = chartFor(series.second)) {
            chart->setSeries(runId, series.second, points);
            m_lastStep[series] = points.back().step;
        }
    }
}

void Dashboard::plotLive(int64_t runId, const std::string& key, const core::MetricPoint& p) {
    MetricChart* chart = chartFor(key);
    if (!chart) return;
    m_live[{runId, key}].push_back(p);
    if (!isShown(runId)) return;
    auto [it, inserted] = m_lastStep.try_emplace({runId, key}, std::numeric_limits<int64_t>::min());
    if (p.step <= it->second) return;  // already loaded from the store
    it->second = p.step;
    chart->appendPoints(runId, key, {p});
}

void Dashboard::onEvent(int64_t runId, const core::Event& event) {
    if (event.type != core::Event::Type::Metric) return;
    core::MetricPoint p;
    p.step = event.step;
    p.value = event.value;
    p.wallTime = event.wallTime;
    plotLive(runId, event.key, p);
}

void Dashboard::onEvents(int64_t runId, const std::vector<core::Event>& events) {
    for (const auto& e : events) onEvent(runId, e);
}

void Dashboard::forgetLive(int64_t runId) {
    for (auto it = m_live.begin(); it != m_live.end();) {
        if (it->first.first == runId)
            it = m_live.erase(it);
        else
            ++it;
    }
}

bool Dashboard::exportCharts(const QString& path, int width, int height) {
    m_loss->flushStaged();
    m_accuracy->flushStaged();
    const int half = height / 2;
    const bool pdf = QFileInfo(path).suffix().compare(QLatin1String("pdf"), Qt::CaseInsensitive) == 0;
    if (pdf) {
        QPdfWriter writer(path);
        // 96 dpi device units keep fonts the same size relative to the plot as on screen.
        writer.setResolution(96);
        writer.setPageSize(QPageSize(QSizeF(width * 72.0 / 96.0, height * 72.0 / 96.0), QPageSize::Point));
        writer.setPageMargins(QMarginsF(0, 0, 0, 0));
        writer.setCreator(QStringLiteral("Lathe"));
        QCPPainter painter;
        if (!painter.begin(&writer)) return false;
        painter.setMode(QCPPainter::pmVectorized);
        painter.setMode(QCPPainter::pmNoCaching);
        m_loss->plot()->toPainter(&painter, width, half);
        painter.translate(0, half);
        m_accuracy->plot()->toPainter(&painter, width, height - half);
        return painter.end();
    }
    QImage image(width, height, QImage::Format_ARGB32_Premultiplied);
    image.fill(Qt::white);
    {
        QCPPainter painter(&image);
        painter.setRenderHint(QPainter::Antialiasing);
        m_loss->plot()->toPainter(&painter, width, half);
        painter.translate(0, half);
        m_accuracy->plot()->toPainter(&painter, width, height - half);
    }
    return image.save(path);
}

}  // namespace lathe::widgets
