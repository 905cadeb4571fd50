#pragma once
// The Data sets page: the workspace's versioned data sets (core::DataSets, what `lathectl data`
// writes) in a tree — each data set with its current version, its versions beneath (number, short
// root hash, files, size, created, message, the current one marked) — and, for the selected
// version, its lineage: data set version -> runs that trained on it -> model versions registered
// from them -> their deployments (which is also the reverse question: what was trained on this
// version), with the version's files below.
//
// DataSets opens its own SQLite connection and is safe from one thread at a time: the view keeps
// one per workspace and uses it only from a one-thread pool; results come back by queued call,
// and a generation counter drops reads of a workspace switched away from (and lineage reads of a
// selection that moved on).
#include <QString>
#include <QStringList>
#include <QThreadPool>
#include <QWidget>

#include <atomic>
#include <cstdint>
#include <memory>

class QLabel;
class QPushButton;
class QStackedWidget;
class QTreeWidget;

namespace lathe::widgets {

class DataSetsView : public QWidget {
    Q_OBJECT
public:
    /// Item data of the tree's rows (column 0).
    enum Role {
        NameRole = Qt::UserRole + 1,  // the data set's name
        VersionRole,                  // the version's number; 0 on a data set's row
        CurrentVersionRole,           // the data set's current version's number (every row)
        CurrentRole,                  // whether a version row is the current version
    };
    /// Item data of the lineage tree's rows (column 0).
    enum LineageRole {
        KindRole = Qt::UserRole + 1,  // "data", "run", "model", "deployment" or "none"
        RunIdRole,                    // a run row's run id
        ModelNameRole,                // a model row's model name
        ModelVersionRole,             // a model row's version
    };
    enum Column {
        ColName,
        ColKind,
        ColCurrent,
        ColRoot,
        ColFiles,
        ColSize,
        ColCreated,
        ColMessage,
        ColumnCount
    };

    explicit DataSetsView(QWidget* parent = nullptr);
    /// Waits for a read in flight.
    ~DataSetsView() override;

    /// The workspace file whose data sets are shown (empty: none); read at once.
    void setWorkspace(const QString& path);
    QString workspace() const { return m_path; }
    /// Re-reads the data sets in the background; refreshed() follows. Asked again while a read is
    /// in flight, it reads once more after it.
    void refresh();
    bool isRefreshing() const { return m_refreshing; }
    int refreshCount() const { return m_refreshCount; }
    /// Whether the lineage of the selected version is being read.
    bool isLoadingLineage() const { return m_lineageLoading; }

    /// Selects NAME's version `version` (0: its data set row, which shows its current version).
    void selectVersion(const QString& name, int64_t version = 0);
    QString selectedDataSet() const;
    /// The selected version's number (the current one's when a data set row is selected); 0: none.
    int64_t selectedVersion() const;
    /// The names of the data sets of the last read.
    QStringList dataSetNames() const;

    QTreeWidget* tree() const { return m_tree; }
    QTreeWidget* lineageTree() const { return m_lineage; }
    QTreeWidget* filesList() const { return m_files; }
    QLabel* versionLabel() const { return m_version; }
    QLabel* emptyLabel() const { return m_empty; }
    QPushButton* refreshButton() const { return m_refresh; }
    /// Whether the page shows its empty state (the workspace has no data set).
    bool isEmptyShown() const;
    /// The line beside Refresh (errors in red).
    QString statusText() const;

Q_SIGNALS:
    /// A run of the lineage was double-clicked: show it.
    void runRequested(qint64 runId);
    /// A model version of the lineage was double-clicked: show it.
    void modelRequested(const QString& model, qint64 version);
    /// After a read of the data sets was applied (also after a failed one: see statusText()).
    void refreshed();
    /// The selected version's lineage and files are shown.
    void lineageLoaded();

protected:
    void showEvent(QShowEvent* event) override;

private:
    struct Source;
    struct ListRead;
    struct LineageRead;
    void applyRefresh(uint64_t generation, const std::shared_ptr<ListRead>& read);
    void applyLineage(uint64_t generation, uint64_t request, const std::shared_ptr<LineageRead>& read);
    /// Reads the selected version's lineage and files (again when `force`, else only when the
    /// selection moved to another version).
    void loadLineage(bool force);
    void clearDetails(const QString& text = {});
    void setStatusText(const QString& text, bool error = false);

    QString m_path;
    std::shared_ptr<Source> m_source;  // used only on m_pool's one thread
    QStackedWidget* m_stack = nullptr;
    QTreeWidget* m_tree = nullptr;
    QTreeWidget* m_lineage = nullptr;
    QTreeWidget* m_files = nullptr;
    QLabel* m_version = nullptr;
    QLabel* m_empty = nullptr;
    QLabel* m_status = nullptr;
    QPushButton* m_refresh = nullptr;

    QThreadPool m_pool;
    std::atomic<uint64_t> m_generation{0};      // bumped when the workspace changes: its reads are dropped
    std::atomic<uint64_t> m_lineageRequest{0};  // only the latest selection's lineage is shown
    QString m_lineageName;                      // what the lineage panel shows (or is loading)
    int64_t m_lineageVersion = 0;
    bool m_refreshing = false;
    bool m_refreshAgain = false;
    bool m_lineageLoading = false;
    int m_refreshCount = 0;
    bool m_selectedOnce = false;  // the first read picks a row; later ones keep the user's choice
    QStringList m_seen;           // data sets whose row was expanded once
};

}  // namespace lathe::widgets
