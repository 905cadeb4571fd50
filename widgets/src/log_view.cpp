#include "lathe/widgets/log_view.h"

#include <QBrush>
#include <QColor>
#include <QDateTime>
#include <QHeaderView>
#include <QLabel>
#include <QPlainTextEdit>
#include <QRegularExpression>
#include <QScrollBar>
#include <QTableWidget>
#include <QTextBlock>
#include <QTextCharFormat>
#include <QTextCursor>
#include <QVBoxLayout>

#include <algorithm>

#include "lathe/core/run_status.h"

namespace lathe::widgets {

namespace {

// Lines kept per live run that is not shown (a run logs a few lines per epoch; this is a guard).
constexpr size_t kMaxLiveLines = 50000;

enum RankColumn { RankCol = 0, HostCol, AddressCol, MachineCol, StateCol, RankColumnCount };

QColor levelColor(const std::string& level) {
    if (level == "error") return QColor(0xc6, 0x28, 0x28);
    if (level == "warn" || level == "warning") return QColor(0xe6, 0x51, 0x00);
    return {};
}

}  // namespace

std::optional<LogView::HostLine> LogView::parseHostLine(const QString& text) {
    static const QRegularExpression re(
        QStringLiteral(R"(^host (\S+) \(([^)]*)\): (.*); ranks (\d+)\.\.(\d+)$)"));
    const auto m = re.match(text);
    if (!m.hasMatch()) return std::nullopt;
    HostLine h;
    h.host = m.captured(1);
    h.address = m.captured(2);
    h.machine = m.captured(3);
    bool ok1 = false, ok2 = false;
    h.firstRank = m.captured(4).toInt(&ok1);
    h.lastRank = m.captured(5).toInt(&ok2);
    if (!ok1 || !ok2 || h.lastRank < h.firstRank || h.lastRank - h.firstRank > 4096) return std::nullopt;
    return h;
}

std::optional<LogView::RankExit> LogView::parseRankExit(const QString& text) {
    static const QRegularExpression re(QStringLiteral(R"(^rank (\d+) \(on ([^)]+)\) ([^:;]+))"));
    const auto m = re.match(text);
    if (!m.hasMatch()) return std::nullopt;
    RankExit x;
    bool ok = false;
    x.rank = m.captured(1).toInt(&ok);
    if (!ok) return std::nullopt;
    x.host = m.captured(2);
    x.description = m.captured(3).trimmed();
    return x;
}

QString LogView::parsePlacement(const QString& text) {
    static const QRegularExpression re(QStringLiteral(R"(^starting \d+ ranks on (\S+)$)"));
    const auto m = re.match(text);
    return m.hasMatch() ? m.captured(1) : QString();
}

LogView::LogView(QWidget* parent) : QWidget(parent) {
    m_header = new QLabel(this);
    m_header->setObjectName(QStringLiteral("logPlacement"));
    m_header->setTextInteractionFlags(Qt::TextSelectableByMouse);
    m_header->hide();

    m_ranks = new QTableWidget(0, RankColumnCount, this);
    m_ranks->setObjectName(QStringLiteral("logRanks"));
    m_ranks->setHorizontalHeaderLabels({tr("Rank"), tr("Host"), tr("Address"), tr("Machine"), tr("State")});
    m_ranks->verticalHeader()->hide();
    m_ranks->horizontalHeader()->setStretchLastSection(true);
    m_ranks->setEditTriggers(QAbstractItemView::NoEditTriggers);
    m_ranks->setSelectionBehavior(QAbstractItemView::SelectRows);
    m_ranks->setAlternatingRowColors(true);
    m_ranks->setWordWrap(false);
    m_ranks->setMaximumHeight(160);
    m_ranks->hide();

    m_text = new QPlainTextEdit(this);
    m_text->setObjectName(QStringLiteral("logText"));
    m_text->setReadOnly(true);
    m_text->setLineWrapMode(QPlainTextEdit::NoWrap);
    m_text->setMaximumBlockCount(200000);
    QFont mono = m_text->font();
    mono.setStyleHint(QFont::Monospace);
    mono.setFamily(QStringLiteral("monospace"));
    m_text->setFont(mono);
    m_text->setPlaceholderText(tr("Select a run to see its log"));

    auto* layout = new QVBoxLayout(this);
    layout->setContentsMargins(4, 4, 4, 4);
    layout->setSpacing(4);
    layout->addWidget(m_header);
    layout->addWidget(m_ranks);
    layout->addWidget(m_text, 1);
}

LogView::~LogView() = default;

QString LogView::tabTitle() const { return tr("Log"); }

QString LogView::tabToolTip() const {
    return tr(
        "The run's log: progress, checkpoints, warnings and errors; for a run across hosts, where each "
        "rank runs and how it ended");
}

std::optional<LogView::Line> LogView::lineOf(const core::Event& e) {
    // The same text the store records for the event (core::recordEvent), so both merge.
    switch (e.type) {
        case core::Event::Type::Log:
            return Line{e.wallTime, e.level.empty() ? "info" : e.level, e.text};
        case core::Event::Type::Error:
            return Line{e.wallTime, "error", e.text};
        case core::Event::Type::Checkpoint:
            return Line{e.wallTime, "info",
                        "checkpoint after epoch " + std::to_string(static_cast<int64_t>(e.value)) +
                            " (step " + std::to_string(e.step) + "): " + e.text};
        default:
            return std::nullopt;
    }
}

void LogView::resetShown() {
    m_runId = 0;
    m_runStatus.clear();
    m_lineCount = 0;
    m_seen.clear();
    m_placement.clear();
    m_hosts.clear();
    m_rankStates.clear();
    m_text->clear();
    m_header->hide();
    m_ranks->setRowCount(0);
    m_ranks->hide();
}

void LogView::clear() { resetShown(); }

void LogView::showRuns(const core::Store& store, const std::vector<int64_t>& runIds) {
    const int64_t first = runIds.empty() ? 0 : runIds.front();
    if (first != 0 && first == m_runId) return;
    showRun(store, first);
}

void LogView::showRun(const core::Store& store, int64_t runId) {
    resetShown();
    m_runId = runId;
    if (runId == 0) return;
    std::vector<Line> lines;
    if (const auto run = store.run(runId)) m_runStatus = QString::fromLatin1(core::toString(run->status));
    for (const auto& l : store.logs(runId)) lines.push_back(Line{l.wallTime, l.level, l.text});
    if (auto it = m_live.find(runId); it != m_live.end()) {
        std::set<std::pair<double, std::string>> stored;
        for (const auto& l : lines) stored.emplace(l.wallTime, l.text);
        for (const auto& l : it->second)
            if (!stored.count({l.wallTime, l.text})) lines.push_back(l);
        std::stable_sort(lines.begin(), lines.end(),
                         [](const Line& a, const Line& b) { return a.wallTime < b.wallTime; });
    }
    if (auto it = m_liveStatus.find(runId);
        it != m_liveStatus.end() && m_runStatus != QLatin1String("completed") &&
        m_runStatus != QLatin1String("failed") && m_runStatus != QLatin1String("stopped"))
        m_runStatus = it->second;
    for (const auto& l : lines) append(l);
    updateRanks();
    m_text->moveCursor(QTextCursor::End);
}

void LogView::onEvents(int64_t runId, const std::vector<core::Event>& events) {
    bool ranksChanged = false;
    for (const auto& e : events) {
        if (e.type == core::Event::Type::Status) {
            m_liveStatus[runId] = QString::fromStdString(e.text);
            if (runId == m_runId) {
                m_runStatus = QString::fromStdString(e.text);
                ranksChanged = true;
            }
            continue;
        }
        const auto line = lineOf(e);
        if (!line) continue;
        auto& live = m_live[runId];
        if (live.size() >= kMaxLiveLines) live.erase(live.begin(), live.begin() + live.size() / 2);
        live.push_back(*line);
        if (runId == m_runId) {
            append(*line);
            ranksChanged = true;
        }
    }
    if (ranksChanged) updateRanks();
}

void LogView::forgetLive(int64_t runId) {
    m_live.erase(runId);
    m_liveStatus.erase(runId);
}

void LogView::onRunFinished(const core::Store& store, int64_t runId) {
    if (runId != m_runId) return;
    if (const auto run = store.run(runId)) m_runStatus = QString::fromLatin1(core::toString(run->status));
    updateRanks();
}

void LogView::append(const Line& line) {
    if (!m_seen.emplace(line.wallTime, line.text).second) return;
    ++m_lineCount;
    analyse(line);
    QScrollBar* bar = m_text->verticalScrollBar();
    const bool atEnd = bar->value() >= bar->maximum() - 2;
    const QString stamp = line.wallTime > 0
                              ? QDateTime::fromMSecsSinceEpoch(static_cast<qint64>(line.wallTime * 1000.0))
                                    .toString(QStringLiteral("HH:mm:ss"))
                              : QStringLiteral("--:--:--");
    const QString text = QStringLiteral("%1  %2  %3")
                             .arg(stamp, QString::fromStdString(line.level).leftJustified(5),
                                  QString::fromStdString(line.text));
    QTextCharFormat format;
    const QColor color = levelColor(line.level);
    if (color.isValid()) format.setForeground(color);
    QTextCursor cursor(m_text->document());
    cursor.movePosition(QTextCursor::End);
    if (!m_text->document()->isEmpty()) cursor.insertBlock();
    cursor.insertText(text, format);
    if (atEnd) bar->setValue(bar->maximum());
}

void LogView::analyse(const Line& line) {
    const QString text = QString::fromStdString(line.text);
    if (const QString p = parsePlacement(text); !p.isEmpty()) {
        m_placement = p;
        return;
    }
    if (const auto h = parseHostLine(text)) {
        // A resumed run launches again: the newest placement of a host wins.
        m_hosts.erase(std::remove_if(m_hosts.begin(), m_hosts.end(),
                                     [&](const HostLine& o) { return o.host == h->host; }),
                      m_hosts.end());
        m_hosts.push_back(*h);
        std::sort(m_hosts.begin(), m_hosts.end(),
                  [](const HostLine& a, const HostLine& b) { return a.firstRank < b.firstRank; });
        return;
    }
    if (const auto x = parseRankExit(text)) {
        // The error names the rank that failed the run; warnings describe the others' ends.
        m_rankStates[x->rank] = line.level == "error" ? tr("failed: %1").arg(x->description) : x->description;
    }
}

int LogView::rankCount() const {
    int n = 0;
    for (const auto& h : m_hosts) n = std::max(n, h.lastRank + 1);
    return n;
}

QString LogView::rankHost(int rank) const {
    for (const auto& h : m_hosts)
        if (rank >= h.firstRank && rank <= h.lastRank) return h.host;
    return {};
}

QString LogView::rankState(int rank) const {
    if (auto it = m_rankStates.find(rank); it != m_rankStates.end()) return it->second;
    if (m_runStatus == QLatin1String("failed")) {
        // Another rank failed the run: this one was stopped with it.
        for (const auto& [r, state] : m_rankStates)
            if (state.startsWith(QLatin1String("failed"))) return tr("stopped");
    }
    return m_runStatus;
}

void LogView::updateRanks() {
    if (!m_placement.isEmpty()) {
        m_header->setText(tr("Ranks on %1 (%2)").arg(m_placement, m_runStatus));
        m_header->show();
    } else {
        m_header->hide();
    }
    const int ranks = rankCount();
    if (ranks == 0) {
        m_ranks->setRowCount(0);
        m_ranks->hide();
        return;
    }
    m_ranks->setRowCount(ranks);
    for (int r = 0; r < ranks; ++r) {
        const HostLine* host = nullptr;
        for (const auto& h : m_hosts)
            if (r >= h.firstRank && r <= h.lastRank) host = &h;
        const QString state = rankState(r);
        const QString cells[RankColumnCount] = {QString::number(r), host ? host->host : QString(),
                                                host ? host->address : QString(),
                                                host ? host->machine : QString(), state};
        for (int c = 0; c < RankColumnCount; ++c) {
            auto* item = m_ranks->item(r, c);
            if (!item) {
                item = new QTableWidgetItem;
                m_ranks->setItem(r, c, item);
            }
            item->setText(cells[c]);
            item->setToolTip(cells[c]);
        }
        QColor color;
        if (state.startsWith(QLatin1String("failed")) || state.contains(QLatin1String("killed")))
            color = QColor(0xc6, 0x28, 0x28);
        else if (state == QLatin1String("completed"))
            color = QColor(0x2e, 0x7d, 0x32);
        else if (state == QLatin1String("running"))
            color = QColor(0x15, 0x65, 0xc0);
        m_ranks->item(r, StateCol)
            ->setData(Qt::ForegroundRole, color.isValid() ? QVariant(QBrush(color)) : QVariant());
    }
    m_ranks->resizeColumnsToContents();
    m_ranks->show();
}

QString LogView::logText() const { return m_text->toPlainText(); }

}  // namespace lathe::widgets
