#pragma once
// The New Study dialog (Studies page → New study…): a hyper-parameter study of a base run
// configuration (the run form's), as `lathectl tune` takes it — the search space, one row per key
// (its distribution and bounds or choices), the objective and direction, how many trials and how
// many at a time, the algorithm, ASHA's early stopping and the study's name. It is checked as it
// is edited with core::checkStudy, the checks lathectl tune makes, so Start is offered only for a
// study that will start; the window then runs `lathectl tune` with tuneArguments().
#include <QDialog>
#include <QStringList>

#include "lathe/core/run_spec.h"
#include "lathe/core/studies.h"

class QCheckBox;
class QComboBox;
class QDoubleSpinBox;
class QLabel;
class QLineEdit;
class QPushButton;
class QSpinBox;
class QTableWidget;

namespace lathe::widgets {

class StudyDialog : public QDialog {
    Q_OBJECT
public:
    /// Columns of the space table.
    enum SpaceColumn { ColKey, ColKind, ColValues, SpaceColumnCount };

    /// `existing`: the workspace's study names (a new study needs a name of its own).
    StudyDialog(const core::RunSpec& base, const QStringList& existing, QWidget* parent = nullptr);

    /// The study the form describes, as lathectl tune would record it (base config included).
    core::StudyRecord study() const;
    /// `lathectl tune` arguments that follow the base CONFIG file: --study, --space …, …
    QStringList tuneArguments() const;
    /// Empty when the study can start; else what is wrong (shown under the form).
    QString problem() const { return m_problem; }
    const core::RunSpec& base() const { return m_base; }

    /// Adds a row to the space: KEY, its distribution (uniform, loguniform, int, logint, choice)
    /// and "A, B" bounds or "V1, V2, …" choices (a choice may be a list: "[64], [128,128]").
    void addSpaceRow(const QString& key, const QString& kind, const QString& values);
    void clearSpace();
    /// The space's entries as lathectl tune takes them ("lr=loguniform(1e-4,1e-1)").
    QStringList spaceEntries() const;

    QLineEdit* nameEdit() const { return m_name; }
    QTableWidget* spaceTable() const { return m_space; }
    QComboBox* objectiveBox() const { return m_objective; }
    QComboBox* directionBox() const { return m_direction; }
    QSpinBox* trialsBox() const { return m_trials; }
    QSpinBox* parallelBox() const { return m_parallel; }
    /// random | tpe | asha | ppo (item data), as lathectl tune --algo.
    QComboBox* algorithmBox() const { return m_algorithm; }
    /// ASHA's early stopping with any algorithm (--pruner asha); checked and fixed for "asha".
    QCheckBox* ashaBox() const { return m_asha; }
    QDoubleSpinBox* minBudgetBox() const { return m_minBudget; }
    QSpinBox* etaBox() const { return m_eta; }
    QPushButton* startButton() const { return m_start; }
    QLabel* problemLabel() const { return m_problemLabel; }

private:
    void revalidate();
    void updateEnabled();

    core::RunSpec m_base;
    QStringList m_existing;
    QString m_problem;
    QLineEdit* m_name = nullptr;
    QTableWidget* m_space = nullptr;
    QComboBox* m_objective = nullptr;
    QComboBox* m_direction = nullptr;
    QSpinBox* m_trials = nullptr;
    QSpinBox* m_parallel = nullptr;
    QComboBox* m_algorithm = nullptr;
    QCheckBox* m_asha = nullptr;
    QDoubleSpinBox* m_minBudget = nullptr;
    QSpinBox* m_eta = nullptr;
    QSpinBox* m_seed = nullptr;
    QLabel* m_baseLabel = nullptr;
    QLabel* m_problemLabel = nullptr;
    QPushButton* m_start = nullptr;
};

}  // namespace lathe::widgets
