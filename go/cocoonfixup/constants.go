package cocoonfixup

// Annotation keys the stack writes and the step reads (spec section 2).
const (
	KeyVMName               = "vm.cocoonstack.io/name"
	KeyVMID                 = "vm.cocoonstack.io/id"
	KeyBackend              = "vm.cocoonstack.io/backend"
	KeyOS                   = "cocoonset.cocoonstack.io/os"
	KeyManaged              = "cocoonset.cocoonstack.io/managed"
	KeyMode                 = "cocoonset.cocoonstack.io/mode"
	KeyForkFrom             = "vm.cocoonstack.io/fork-from"
	KeyCloneFromDir         = "vm.cocoonstack.io/clone-from-dir"
	KeyRestoreFromHibernate = "vm.cocoonstack.io/restore-from-hibernate"
	KeyGuestFlavor          = "vm.cocoonstack.io/guest-flavor"
	KeyHibernate            = "vm.cocoonstack.io/hibernate"
	KeyGeneration           = "cocoonset.cocoonstack.io/generation"
)

// The reasons of the events the step records (spec sections 5-10).
const (
	ReasonExecAttemptFailed     = "PostCloneExecAttemptFailed"
	ReasonSucceeded             = "PostCloneSucceeded"
	ReasonExecExhausted         = "PostCloneExecExhausted"
	ReasonIPWaitTimeout         = "PostCloneIPWaitTimeout"
	ReasonWakeIPWaitTimeout     = "WakeIPWaitTimeout"
	ReasonDHCPRecovery          = "PostCloneDHCPRecovery"
	ReasonResumedAfterRestart   = "ResumedAfterRestart"
	ReasonPlanFailed            = "PostClonePlanFailed"
	ReasonVMMismatch            = "PostCloneVMMismatch"
	ReasonNodeError             = "PostCloneNodeError"
	ReasonPluginFallback        = "PostClonePluginFallback"
	ReasonWindowsStaticIPFailed = "WindowsStaticIPFailed"
	// A parent's preparation (Planner.Prepare).
	ReasonParentPrepared             = "ParentPrepared"
	ReasonParentPrepareAttemptFailed = "ParentPrepareAttemptFailed"
	ReasonParentPrepareFailed        = "ParentPrepareFailed"
)

// Annotation keys the step writes (spec sections 5-9).
const (
	KeyPostCloneState   = "vm.cocoonstack.io/post-clone-state"
	KeyPostCloneHint    = "vm.cocoonstack.io/post-clone-hint"
	KeyPostCloneErrors  = "vm.cocoonstack.io/post-clone-errors"
	KeyIP               = "vm.cocoonstack.io/ip"
	KeyLifecycleState   = "vm.cocoonstack.io/lifecycle-state"
	KeyLifecycleMessage = "vm.cocoonstack.io/lifecycle-state-message"
	// KeyLifecycleObservedGeneration is the generation the lifecycle
	// state was decided for.
	KeyLifecycleObservedGeneration = "vm.cocoonstack.io/lifecycle-observed-generation"
)

// KeyPrepared is what Planner.Prepare writes on a parent it
// prepared (`<plugin> <version> sha256:<digest>`); copy it onto the
// parent's clones.
const KeyPrepared = "vm.cocoonstack.io/prepared"

// What Run did with the pod (Outcome.Action).
type Handled string

const (
	HandledNothing    Handled = "nothing"
	HandledParked     Handled = "parked"
	HandledVMMismatch Handled = "vm-mismatch"
	HandledFixup      Handled = "fixup"
	HandledIPWait     Handled = "ip-wait"
	HandledGone       Handled = "gone"
	HandledShutdown   Handled = "shutdown"
	HandledPrepare    Handled = "prepare"
)

// How the fixup loop ended (Outcome.Fixup).
type FixupEnd string

const (
	FixupDone       FixupEnd = "done"
	FixupExhausted  FixupEnd = "exhausted"
	FixupPlanFailed FixupEnd = "plan-failed"
	FixupShutdown   FixupEnd = "shutdown"
	FixupGone       FixupEnd = "gone"
)

// How the IP wait ended (Outcome.Readiness).
type Readiness string

const (
	ReadinessReady    Readiness = "ready"
	ReadinessTimedOut Readiness = "timed-out"
	ReadinessShutdown Readiness = "shutdown"
	ReadinessGone     Readiness = "gone"
)

// How the serial-console pass ended (Outcome.SAC).
type SACEnd string

const (
	SACSet      SACEnd = "set"
	SACFailed   SACEnd = "failed"
	SACShutdown SACEnd = "shutdown"
	SACGone     SACEnd = "gone"
)

// Why a pod was left alone (Outcome.HandsOff).
type HandsOff string

const (
	HandsOffStackOwns          HandsOff = "stack-owns"
	HandsOffHibernateRequested HandsOff = "hibernate-requested"
	HandsOffDeleting           HandsOff = "deleting"
	HandsOffMacos              HandsOff = "macos"
	HandsOffNotManaged         HandsOff = "not-managed"
	HandsOffNotCloned          HandsOff = "not-cloned"
	HandsOffNotSettled         HandsOff = "not-settled"
)

// The network scenario a fixup ran (Outcome.Scenario).
type Scenario string

const (
	ScenarioCloudimg    Scenario = "cloudimg"
	ScenarioOCINetworkd Scenario = "oci-networkd"
	ScenarioFCMAC       Scenario = "fc-mac"
	ScenarioWindowsPnP  Scenario = "windows-pnp"
)

// The lifecycle-state values (KeyLifecycleState).
type LifecycleState string

const (
	LifecycleCreating    LifecycleState = "creating"
	LifecycleReady       LifecycleState = "ready"
	LifecycleHibernating LifecycleState = "hibernating"
	LifecycleHibernated  LifecycleState = "hibernated"
	LifecycleFailed      LifecycleState = "failed"
)
