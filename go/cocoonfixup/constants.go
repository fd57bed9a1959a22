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

// KeyPrepared is what Planner.Prepare writes on a parent it
// prepared (`<plugin> <version> sha256:<digest>`); copy it onto the
// parent's clones.
const KeyPrepared = "vm.cocoonstack.io/prepared"
