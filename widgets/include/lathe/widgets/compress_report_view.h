#pragma once
// A compressed version against its parent, as measured side by side when it was made
// (core::CompressReport): accuracy, size and latency as paired bars, accuracy per class, and the
// layers with what happened to each (for pruning, the channels kept).
#include <QWidget>

#include "lathe/core/compress.h"

class QCustomPlot;
class QLabel;
class QTableWidget;

namespace lathe::widgets {

class CompressReportView : public QWidget {
    Q_OBJECT
public:
    explicit CompressReportView(QWidget* parent = nullptr);
    /// `parentName` / `childName`: how the two are labelled, e.g. "digits v1" and "digits v2".
    void setReport(const core::CompressReport& report, const QString& parentName, const QString& childName);
    void clear();

    QCustomPlot* summaryPlot() const { return m_summary; }
    QCustomPlot* classPlot() const { return m_classes; }
    /// Pruning: neurons / channels per layer, parent vs kept (hidden for other methods).
    QCustomPlot* keptPlot() const { return m_kept; }
    QTableWidget* layerTable() const { return m_layers; }
    QString headline() const;

private:
    QLabel* m_headline = nullptr;
    QCustomPlot* m_summary = nullptr;  // accuracy, size, latency b1, latency b32: parent vs compressed
    QCustomPlot* m_classes = nullptr;  // accuracy per class
    QCustomPlot* m_kept = nullptr;     // pruning: outputs per layer, parent vs kept
    QTableWidget* m_layers = nullptr;
};

}  // namespace lathe::widgets
