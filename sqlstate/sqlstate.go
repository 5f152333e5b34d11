// Package sqlstate is pgscribe's one classifier of database errors
// (transient, integrity, structural: docs/failures.md) and the retry
// helper it drives. Every error that reaches a
// batch commit goes through Classify, which decides between retrying the
// batch, isolating and dead-lettering events, and halting; the engine's
// own fenced writes and its session restarts retry through the same
// Backoff. It imports nothing of pgscribe's, so every stage (source, lock,
// commit, probe) can use it.
package sqlstate

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"
)

// Class is how a batch responds to an error.
type Class int

// The error classes. ClassNone is the class of a nil error only.
const (
	// ClassNone: no error.
	ClassNone Class = iota
	// ClassTransient: the batch did not commit for a reason unrelated to its
	// events (lost connection, serialization failure, deadlock, lock or
	// statement timeout, server shutting down, too many connections). Roll
	// back, ack nothing, retry the same batch with backoff.
	//
	// A cancelled context is transient too: nothing is wrong with the batch,
	// and a process that restarts will retry it. A retry loop must therefore
	// check its own context before sleeping and stop when it is done, since
	// cancellation means shutdown.
	ClassTransient
	// ClassIntegrity: one or more events carry data the target rejects
	// (constraint violations, class 23; data exceptions, class 22). Isolate
	// the failing events and dead-letter them; commit the rest.
	ClassIntegrity
	// ClassStructural: the deployment is broken (missing table, column,
	// privilege, schema; anything not known to be transient or integrity).
	// Halt the projection loudly; ack nothing.
	ClassStructural
)

// String returns the class's lowercase name, usable as a bounded metric label.
func (c Class) String() string {
	switch c {
	case ClassNone:
		return "none"
	case ClassTransient:
		return "transient"
	case ClassIntegrity:
		return "integrity"
	case ClassStructural:
		return "structural"
	}
	return "unknown"
}

// Classify returns the class of err, looking through wrapping (%w).
//
// A server error (*pgconn.PgError anywhere in the chain) is classified by its
// SQLSTATE, even when it came while connecting: a wrong password (28P01) or a
// missing database (3D000) is structural, not something to retry forever.
// Without a SQLSTATE, connection-level failures are transient: pgx errors
// that are safe to retry or are timeouts, *pgconn.ConnectError, net.Error,
// io.EOF, io.ErrUnexpectedEOF, ECONNRESET, ECONNREFUSED, ECONNABORTED,
// EPIPE, ETIMEDOUT, context.DeadlineExceeded and context.Canceled (see
// ClassTransient). Everything else is structural.
func Classify(err error) Class {
	if err == nil {
		return ClassNone
	}
	if code := Code(err); code != "" {
		return classifyCode(code)
	}
	if transientConnError(err) {
		return ClassTransient
	}
	return ClassStructural
}

func classifyCode(code string) Class {
	switch {
	case pgerrcode.IsConnectionException(code), // 08
		pgerrcode.IsInsufficientResources(code): // 53
		return ClassTransient
	case pgerrcode.IsIntegrityConstraintViolation(code), // 23
		pgerrcode.IsDataException(code): // 22
		return ClassIntegrity
	}
	// 25P03: the server ended an idle batch transaction and its session, as
	// after a connection loss.
	switch code {
	case pgerrcode.TransactionRollback, // 40000
		pgerrcode.SerializationFailure,            // 40001
		pgerrcode.StatementCompletionUnknown,      // 40003
		pgerrcode.DeadlockDetected,                // 40P01
		pgerrcode.LockNotAvailable,                // 55P03
		pgerrcode.QueryCanceled,                   // 57014: statement_timeout, pg_cancel_backend
		pgerrcode.AdminShutdown,                   // 57P01
		pgerrcode.CrashShutdown,                   // 57P02
		pgerrcode.CannotConnectNow,                // 57P03
		pgerrcode.DatabaseDropped,                 // 57P04
		pgerrcode.IdleSessionTimeout,              // 57P05
		pgerrcode.IdleInTransactionSessionTimeout: // 25P03
		return ClassTransient
	case pgerrcode.TransactionIntegrityConstraintViolation: // 40002: a constraint, despite its class
		return ClassIntegrity
	}
	return ClassStructural
}

func transientConnError(err error) bool {
	var netErr net.Error
	var connectErr *pgconn.ConnectError
	switch {
	case pgconn.SafeToRetry(err), pgconn.Timeout(err),
		errors.As(err, &connectErr), errors.As(err, &netErr),
		errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.ECONNREFUSED),
		errors.Is(err, syscall.ECONNABORTED), errors.Is(err, syscall.EPIPE),
		errors.Is(err, syscall.ETIMEDOUT),
		// A connection the driver already closed (the server went away
		// under it): the next attempt gets a fresh one from the pool.
		errors.Is(err, pgconn.ErrConnClosed), errors.Is(err, net.ErrClosed):
		return true
	}
	return false
}

// Code returns the SQLSTATE of the first *pgconn.PgError in err's chain,
// or "" when there is none.
func Code(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// Describe names err's SQLSTATE with its PostgreSQL condition name, as in
// "23505 (unique_violation)"; this is the <SQLSTATE> (<name>) part of a
// commit dead letter's error_kind. A code this table does not know is
// returned bare; an error without a SQLSTATE gives "".
func Describe(err error) string {
	code := Code(err)
	if code == "" {
		return ""
	}
	if name, ok := conditionNames[code]; ok {
		return code + " (" + name + ")"
	}
	return code
}

// conditionNames maps every SQLSTATE that pgerrcode knows to its condition
// name, in the order and sections of PostgreSQL's src/backend/utils/errcodes.txt
// (from which it was generated; classes 00–02 are not errors but are kept so
// the table stays complete). TestConditionNamesComplete checks it against
// pgerrcode's constants.
var conditionNames = map[string]string{
	// Class 00 — Successful Completion
	pgerrcode.SuccessfulCompletion: "successful_completion",

	// Class 01 — Warning
	pgerrcode.Warning:                          "warning",
	pgerrcode.DynamicResultSetsReturned:        "dynamic_result_sets_returned",
	pgerrcode.ImplicitZeroBitPadding:           "implicit_zero_bit_padding",
	pgerrcode.NullValueEliminatedInSetFunction: "null_value_eliminated_in_set_function",
	pgerrcode.PrivilegeNotGranted:              "privilege_not_granted",
	pgerrcode.PrivilegeNotRevoked:              "privilege_not_revoked",
	pgerrcode.StringDataRightTruncationWarning: "string_data_right_truncation",
	pgerrcode.DeprecatedFeature:                "deprecated_feature",

	// Class 02 — No Data (this is also a warning class per the SQL standard)
	pgerrcode.NoData: "no_data",
	pgerrcode.NoAdditionalDynamicResultSetsReturned: "no_additional_dynamic_result_sets_returned",

	// Class 03 — SQL Statement Not Yet Complete
	pgerrcode.SQLStatementNotYetComplete: "sql_statement_not_yet_complete",

	// Class 08 — Connection Exception
	pgerrcode.ConnectionException:                           "connection_exception",
	pgerrcode.ConnectionDoesNotExist:                        "connection_does_not_exist",
	pgerrcode.ConnectionFailure:                             "connection_failure",
	pgerrcode.SQLClientUnableToEstablishSQLConnection:       "sqlclient_unable_to_establish_sqlconnection",
	pgerrcode.SQLServerRejectedEstablishmentOfSQLConnection: "sqlserver_rejected_establishment_of_sqlconnection",
	pgerrcode.TransactionResolutionUnknown:                  "transaction_resolution_unknown",
	pgerrcode.ProtocolViolation:                             "protocol_violation",

	// Class 09 — Triggered Action Exception
	pgerrcode.TriggeredActionException: "triggered_action_exception",

	// Class 0A — Feature Not Supported
	pgerrcode.FeatureNotSupported: "feature_not_supported",

	// Class 0B — Invalid Transaction Initiation
	pgerrcode.InvalidTransactionInitiation: "invalid_transaction_initiation",

	// Class 0F — Locator Exception
	pgerrcode.LocatorException:            "locator_exception",
	pgerrcode.InvalidLocatorSpecification: "invalid_locator_specification",

	// Class 0L — Invalid Grantor
	pgerrcode.InvalidGrantor:        "invalid_grantor",
	pgerrcode.InvalidGrantOperation: "invalid_grant_operation",

	// Class 0P — Invalid Role Specification
	pgerrcode.InvalidRoleSpecification: "invalid_role_specification",

	// Class 0Z — Diagnostics Exception
	pgerrcode.DiagnosticsException:                           "diagnostics_exception",
	pgerrcode.StackedDiagnosticsAccessedWithoutActiveHandler: "stacked_diagnostics_accessed_without_active_handler",

	// Class 20 — Case Not Found
	pgerrcode.CaseNotFound: "case_not_found",

	// Class 21 — Cardinality Violation
	pgerrcode.CardinalityViolation: "cardinality_violation",

	// Class 22 — Data Exception
	pgerrcode.DataException:                             "data_exception",
	pgerrcode.ArraySubscriptError:                       "array_subscript_error",
	pgerrcode.CharacterNotInRepertoire:                  "character_not_in_repertoire",
	pgerrcode.DatetimeFieldOverflow:                     "datetime_field_overflow",
	pgerrcode.DivisionByZero:                            "division_by_zero",
	pgerrcode.ErrorInAssignment:                         "error_in_assignment",
	pgerrcode.EscapeCharacterConflict:                   "escape_character_conflict",
	pgerrcode.IndicatorOverflow:                         "indicator_overflow",
	pgerrcode.IntervalFieldOverflow:                     "interval_field_overflow",
	pgerrcode.InvalidArgumentForLogarithm:               "invalid_argument_for_logarithm",
	pgerrcode.InvalidArgumentForNtileFunction:           "invalid_argument_for_ntile_function",
	pgerrcode.InvalidArgumentForNthValueFunction:        "invalid_argument_for_nth_value_function",
	pgerrcode.InvalidArgumentForPowerFunction:           "invalid_argument_for_power_function",
	pgerrcode.InvalidArgumentForWidthBucketFunction:     "invalid_argument_for_width_bucket_function",
	pgerrcode.InvalidCharacterValueForCast:              "invalid_character_value_for_cast",
	pgerrcode.InvalidDatetimeFormat:                     "invalid_datetime_format",
	pgerrcode.InvalidEscapeCharacter:                    "invalid_escape_character",
	pgerrcode.InvalidEscapeOctet:                        "invalid_escape_octet",
	pgerrcode.InvalidEscapeSequence:                     "invalid_escape_sequence",
	pgerrcode.NonstandardUseOfEscapeCharacter:           "nonstandard_use_of_escape_character",
	pgerrcode.InvalidIndicatorParameterValue:            "invalid_indicator_parameter_value",
	pgerrcode.InvalidParameterValue:                     "invalid_parameter_value",
	pgerrcode.InvalidPrecedingOrFollowingSize:           "invalid_preceding_or_following_size",
	pgerrcode.InvalidRegularExpression:                  "invalid_regular_expression",
	pgerrcode.InvalidRowCountInLimitClause:              "invalid_row_count_in_limit_clause",
	pgerrcode.InvalidRowCountInResultOffsetClause:       "invalid_row_count_in_result_offset_clause",
	pgerrcode.InvalidTablesampleArgument:                "invalid_tablesample_argument",
	pgerrcode.InvalidTablesampleRepeat:                  "invalid_tablesample_repeat",
	pgerrcode.InvalidTimeZoneDisplacementValue:          "invalid_time_zone_displacement_value",
	pgerrcode.InvalidUseOfEscapeCharacter:               "invalid_use_of_escape_character",
	pgerrcode.MostSpecificTypeMismatch:                  "most_specific_type_mismatch",
	pgerrcode.NullValueNotAllowedDataException:          "null_value_not_allowed",
	pgerrcode.NullValueNoIndicatorParameter:             "null_value_no_indicator_parameter",
	pgerrcode.NumericValueOutOfRange:                    "numeric_value_out_of_range",
	pgerrcode.SequenceGeneratorLimitExceeded:            "sequence_generator_limit_exceeded",
	pgerrcode.StringDataLengthMismatch:                  "string_data_length_mismatch",
	pgerrcode.StringDataRightTruncationDataException:    "string_data_right_truncation",
	pgerrcode.SubstringError:                            "substring_error",
	pgerrcode.TrimError:                                 "trim_error",
	pgerrcode.UnterminatedCString:                       "unterminated_c_string",
	pgerrcode.ZeroLengthCharacterString:                 "zero_length_character_string",
	pgerrcode.FloatingPointException:                    "floating_point_exception",
	pgerrcode.InvalidTextRepresentation:                 "invalid_text_representation",
	pgerrcode.InvalidBinaryRepresentation:               "invalid_binary_representation",
	pgerrcode.BadCopyFileFormat:                         "bad_copy_file_format",
	pgerrcode.UntranslatableCharacter:                   "untranslatable_character",
	pgerrcode.NotAnXMLDocument:                          "not_an_xml_document",
	pgerrcode.InvalidXMLDocument:                        "invalid_xml_document",
	pgerrcode.InvalidXMLContent:                         "invalid_xml_content",
	pgerrcode.InvalidXMLComment:                         "invalid_xml_comment",
	pgerrcode.InvalidXMLProcessingInstruction:           "invalid_xml_processing_instruction",
	pgerrcode.DuplicateJSONObjectKeyValue:               "duplicate_json_object_key_value",
	pgerrcode.InvalidArgumentForSQLJSONDatetimeFunction: "invalid_argument_for_sql_json_datetime_function",
	pgerrcode.InvalidJSONText:                           "invalid_json_text",
	pgerrcode.InvalidSQLJSONSubscript:                   "invalid_sql_json_subscript",
	pgerrcode.MoreThanOneSQLJSONItem:                    "more_than_one_sql_json_item",
	pgerrcode.NoSQLJSONItem:                             "no_sql_json_item",
	pgerrcode.NonNumericSQLJSONItem:                     "non_numeric_sql_json_item",
	pgerrcode.NonUniqueKeysInAJSONObject:                "non_unique_keys_in_a_json_object",
	pgerrcode.SingletonSQLJSONItemRequired:              "singleton_sql_json_item_required",
	pgerrcode.SQLJSONArrayNotFound:                      "sql_json_array_not_found",
	pgerrcode.SQLJSONMemberNotFound:                     "sql_json_member_not_found",
	pgerrcode.SQLJSONNumberNotFound:                     "sql_json_number_not_found",
	pgerrcode.SQLJSONObjectNotFound:                     "sql_json_object_not_found",
	pgerrcode.TooManyJSONArrayElements:                  "too_many_json_array_elements",
	pgerrcode.TooManyJSONObjectMembers:                  "too_many_json_object_members",
	pgerrcode.SQLJSONScalarRequired:                     "sql_json_scalar_required",
	pgerrcode.SQLJSONItemCannotBeCastToTargetType:       "sql_json_item_cannot_be_cast_to_target_type",

	// Class 23 — Integrity Constraint Violation
	pgerrcode.IntegrityConstraintViolation: "integrity_constraint_violation",
	pgerrcode.RestrictViolation:            "restrict_violation",
	pgerrcode.NotNullViolation:             "not_null_violation",
	pgerrcode.ForeignKeyViolation:          "foreign_key_violation",
	pgerrcode.UniqueViolation:              "unique_violation",
	pgerrcode.CheckViolation:               "check_violation",
	pgerrcode.ExclusionViolation:           "exclusion_violation",

	// Class 24 — Invalid Cursor State
	pgerrcode.InvalidCursorState: "invalid_cursor_state",

	// Class 25 — Invalid Transaction State
	pgerrcode.InvalidTransactionState:                         "invalid_transaction_state",
	pgerrcode.ActiveSQLTransaction:                            "active_sql_transaction",
	pgerrcode.BranchTransactionAlreadyActive:                  "branch_transaction_already_active",
	pgerrcode.HeldCursorRequiresSameIsolationLevel:            "held_cursor_requires_same_isolation_level",
	pgerrcode.InappropriateAccessModeForBranchTransaction:     "inappropriate_access_mode_for_branch_transaction",
	pgerrcode.InappropriateIsolationLevelForBranchTransaction: "inappropriate_isolation_level_for_branch_transaction",
	pgerrcode.NoActiveSQLTransactionForBranchTransaction:      "no_active_sql_transaction_for_branch_transaction",
	pgerrcode.ReadOnlySQLTransaction:                          "read_only_sql_transaction",
	pgerrcode.SchemaAndDataStatementMixingNotSupported:        "schema_and_data_statement_mixing_not_supported",
	pgerrcode.NoActiveSQLTransaction:                          "no_active_sql_transaction",
	pgerrcode.InFailedSQLTransaction:                          "in_failed_sql_transaction",
	pgerrcode.IdleInTransactionSessionTimeout:                 "idle_in_transaction_session_timeout",

	// Class 26 — Invalid SQL Statement Name
	pgerrcode.InvalidSQLStatementName: "invalid_sql_statement_name",

	// Class 27 — Triggered Data Change Violation
	pgerrcode.TriggeredDataChangeViolation: "triggered_data_change_violation",

	// Class 28 — Invalid Authorization Specification
	pgerrcode.InvalidAuthorizationSpecification: "invalid_authorization_specification",
	pgerrcode.InvalidPassword:                   "invalid_password",

	// Class 2B — Dependent Privilege Descriptors Still Exist
	pgerrcode.DependentPrivilegeDescriptorsStillExist: "dependent_privilege_descriptors_still_exist",
	pgerrcode.DependentObjectsStillExist:              "dependent_objects_still_exist",

	// Class 2D — Invalid Transaction Termination
	pgerrcode.InvalidTransactionTermination: "invalid_transaction_termination",

	// Class 2F — SQL Routine Exception
	pgerrcode.SQLRoutineException:                                "sql_routine_exception",
	pgerrcode.FunctionExecutedNoReturnStatement:                  "function_executed_no_return_statement",
	pgerrcode.ModifyingSQLDataNotPermittedSQLRoutineException:    "modifying_sql_data_not_permitted",
	pgerrcode.ProhibitedSQLStatementAttemptedSQLRoutineException: "prohibited_sql_statement_attempted",
	pgerrcode.ReadingSQLDataNotPermittedSQLRoutineException:      "reading_sql_data_not_permitted",

	// Class 34 — Invalid Cursor Name
	pgerrcode.InvalidCursorName: "invalid_cursor_name",

	// Class 38 — External Routine Exception
	pgerrcode.ExternalRoutineException:                                "external_routine_exception",
	pgerrcode.ContainingSQLNotPermitted:                               "containing_sql_not_permitted",
	pgerrcode.ModifyingSQLDataNotPermittedExternalRoutineException:    "modifying_sql_data_not_permitted",
	pgerrcode.ProhibitedSQLStatementAttemptedExternalRoutineException: "prohibited_sql_statement_attempted",
	pgerrcode.ReadingSQLDataNotPermittedExternalRoutineException:      "reading_sql_data_not_permitted",

	// Class 39 — External Routine Invocation Exception
	pgerrcode.ExternalRoutineInvocationException:                    "external_routine_invocation_exception",
	pgerrcode.InvalidSQLstateReturned:                               "invalid_sqlstate_returned",
	pgerrcode.NullValueNotAllowedExternalRoutineInvocationException: "null_value_not_allowed",
	pgerrcode.TriggerProtocolViolated:                               "trigger_protocol_violated",
	pgerrcode.SRFProtocolViolated:                                   "srf_protocol_violated",
	pgerrcode.EventTriggerProtocolViolated:                          "event_trigger_protocol_violated",

	// Class 3B — Savepoint Exception
	pgerrcode.SavepointException:            "savepoint_exception",
	pgerrcode.InvalidSavepointSpecification: "invalid_savepoint_specification",

	// Class 3D — Invalid Catalog Name
	pgerrcode.InvalidCatalogName: "invalid_catalog_name",

	// Class 3F — Invalid Schema Name
	pgerrcode.InvalidSchemaName: "invalid_schema_name",

	// Class 40 — Transaction Rollback
	pgerrcode.TransactionRollback:                     "transaction_rollback",
	pgerrcode.TransactionIntegrityConstraintViolation: "transaction_integrity_constraint_violation",
	pgerrcode.SerializationFailure:                    "serialization_failure",
	pgerrcode.StatementCompletionUnknown:              "statement_completion_unknown",
	pgerrcode.DeadlockDetected:                        "deadlock_detected",

	// Class 42 — Syntax Error or Access Rule Violation
	pgerrcode.SyntaxErrorOrAccessRuleViolation:   "syntax_error_or_access_rule_violation",
	pgerrcode.SyntaxError:                        "syntax_error",
	pgerrcode.InsufficientPrivilege:              "insufficient_privilege",
	pgerrcode.CannotCoerce:                       "cannot_coerce",
	pgerrcode.GroupingError:                      "grouping_error",
	pgerrcode.WindowingError:                     "windowing_error",
	pgerrcode.InvalidRecursion:                   "invalid_recursion",
	pgerrcode.InvalidForeignKey:                  "invalid_foreign_key",
	pgerrcode.InvalidName:                        "invalid_name",
	pgerrcode.NameTooLong:                        "name_too_long",
	pgerrcode.ReservedName:                       "reserved_name",
	pgerrcode.DatatypeMismatch:                   "datatype_mismatch",
	pgerrcode.IndeterminateDatatype:              "indeterminate_datatype",
	pgerrcode.CollationMismatch:                  "collation_mismatch",
	pgerrcode.IndeterminateCollation:             "indeterminate_collation",
	pgerrcode.WrongObjectType:                    "wrong_object_type",
	pgerrcode.GeneratedAlways:                    "generated_always",
	pgerrcode.UndefinedColumn:                    "undefined_column",
	pgerrcode.UndefinedFunction:                  "undefined_function",
	pgerrcode.UndefinedTable:                     "undefined_table",
	pgerrcode.UndefinedParameter:                 "undefined_parameter",
	pgerrcode.UndefinedObject:                    "undefined_object",
	pgerrcode.DuplicateColumn:                    "duplicate_column",
	pgerrcode.DuplicateCursor:                    "duplicate_cursor",
	pgerrcode.DuplicateDatabase:                  "duplicate_database",
	pgerrcode.DuplicateFunction:                  "duplicate_function",
	pgerrcode.DuplicatePreparedStatement:         "duplicate_prepared_statement",
	pgerrcode.DuplicateSchema:                    "duplicate_schema",
	pgerrcode.DuplicateTable:                     "duplicate_table",
	pgerrcode.DuplicateAlias:                     "duplicate_alias",
	pgerrcode.DuplicateObject:                    "duplicate_object",
	pgerrcode.AmbiguousColumn:                    "ambiguous_column",
	pgerrcode.AmbiguousFunction:                  "ambiguous_function",
	pgerrcode.AmbiguousParameter:                 "ambiguous_parameter",
	pgerrcode.AmbiguousAlias:                     "ambiguous_alias",
	pgerrcode.InvalidColumnReference:             "invalid_column_reference",
	pgerrcode.InvalidColumnDefinition:            "invalid_column_definition",
	pgerrcode.InvalidCursorDefinition:            "invalid_cursor_definition",
	pgerrcode.InvalidDatabaseDefinition:          "invalid_database_definition",
	pgerrcode.InvalidFunctionDefinition:          "invalid_function_definition",
	pgerrcode.InvalidPreparedStatementDefinition: "invalid_prepared_statement_definition",
	pgerrcode.InvalidSchemaDefinition:            "invalid_schema_definition",
	pgerrcode.InvalidTableDefinition:             "invalid_table_definition",
	pgerrcode.InvalidObjectDefinition:            "invalid_object_definition",

	// Class 44 — WITH CHECK OPTION Violation
	pgerrcode.WithCheckOptionViolation: "with_check_option_violation",

	// Class 53 — Insufficient Resources
	pgerrcode.InsufficientResources:      "insufficient_resources",
	pgerrcode.DiskFull:                   "disk_full",
	pgerrcode.OutOfMemory:                "out_of_memory",
	pgerrcode.TooManyConnections:         "too_many_connections",
	pgerrcode.ConfigurationLimitExceeded: "configuration_limit_exceeded",

	// Class 54 — Program Limit Exceeded
	pgerrcode.ProgramLimitExceeded: "program_limit_exceeded",
	pgerrcode.StatementTooComplex:  "statement_too_complex",
	pgerrcode.TooManyColumns:       "too_many_columns",
	pgerrcode.TooManyArguments:     "too_many_arguments",

	// Class 55 — Object Not In Prerequisite State
	pgerrcode.ObjectNotInPrerequisiteState: "object_not_in_prerequisite_state",
	pgerrcode.ObjectInUse:                  "object_in_use",
	pgerrcode.CantChangeRuntimeParam:       "cant_change_runtime_param",
	pgerrcode.LockNotAvailable:             "lock_not_available",
	pgerrcode.UnsafeNewEnumValueUsage:      "unsafe_new_enum_value_usage",

	// Class 57 — Operator Intervention
	pgerrcode.OperatorIntervention: "operator_intervention",
	pgerrcode.QueryCanceled:        "query_canceled",
	pgerrcode.AdminShutdown:        "admin_shutdown",
	pgerrcode.CrashShutdown:        "crash_shutdown",
	pgerrcode.CannotConnectNow:     "cannot_connect_now",
	pgerrcode.DatabaseDropped:      "database_dropped",
	pgerrcode.IdleSessionTimeout:   "idle_session_timeout",

	// Class 58 — System Error (errors external to PostgreSQL itself)
	pgerrcode.SystemError:   "system_error",
	pgerrcode.IOError:       "io_error",
	pgerrcode.UndefinedFile: "undefined_file",
	pgerrcode.DuplicateFile: "duplicate_file",

	// Class 72 — Snapshot Failure
	pgerrcode.SnapshotTooOld: "snapshot_too_old",

	// Class F0 — Configuration File Error
	pgerrcode.ConfigFileError: "config_file_error",
	pgerrcode.LockFileExists:  "lock_file_exists",

	// Class HV — Foreign Data Wrapper Error (SQL/MED)
	pgerrcode.FDWError:                             "fdw_error",
	pgerrcode.FDWColumnNameNotFound:                "fdw_column_name_not_found",
	pgerrcode.FDWDynamicParameterValueNeeded:       "fdw_dynamic_parameter_value_needed",
	pgerrcode.FDWFunctionSequenceError:             "fdw_function_sequence_error",
	pgerrcode.FDWInconsistentDescriptorInformation: "fdw_inconsistent_descriptor_information",
	pgerrcode.FDWInvalidAttributeValue:             "fdw_invalid_attribute_value",
	pgerrcode.FDWInvalidColumnName:                 "fdw_invalid_column_name",
	pgerrcode.FDWInvalidColumnNumber:               "fdw_invalid_column_number",
	pgerrcode.FDWInvalidDataType:                   "fdw_invalid_data_type",
	pgerrcode.FDWInvalidDataTypeDescriptors:        "fdw_invalid_data_type_descriptors",
	pgerrcode.FDWInvalidDescriptorFieldIdentifier:  "fdw_invalid_descriptor_field_identifier",
	pgerrcode.FDWInvalidHandle:                     "fdw_invalid_handle",
	pgerrcode.FDWInvalidOptionIndex:                "fdw_invalid_option_index",
	pgerrcode.FDWInvalidOptionName:                 "fdw_invalid_option_name",
	pgerrcode.FDWInvalidStringLengthOrBufferLength: "fdw_invalid_string_length_or_buffer_length",
	pgerrcode.FDWInvalidStringFormat:               "fdw_invalid_string_format",
	pgerrcode.FDWInvalidUseOfNullPointer:           "fdw_invalid_use_of_null_pointer",
	pgerrcode.FDWTooManyHandles:                    "fdw_too_many_handles",
	pgerrcode.FDWOutOfMemory:                       "fdw_out_of_memory",
	pgerrcode.FDWNoSchemas:                         "fdw_no_schemas",
	pgerrcode.FDWOptionNameNotFound:                "fdw_option_name_not_found",
	pgerrcode.FDWReplyHandle:                       "fdw_reply_handle",
	pgerrcode.FDWSchemaNotFound:                    "fdw_schema_not_found",
	pgerrcode.FDWTableNotFound:                     "fdw_table_not_found",
	pgerrcode.FDWUnableToCreateExecution:           "fdw_unable_to_create_execution",
	pgerrcode.FDWUnableToCreateReply:               "fdw_unable_to_create_reply",
	pgerrcode.FDWUnableToEstablishConnection:       "fdw_unable_to_establish_connection",

	// Class P0 — PL/pgSQL Error
	pgerrcode.PLpgSQLError:   "plpgsql_error",
	pgerrcode.RaiseException: "raise_exception",
	pgerrcode.NoDataFound:    "no_data_found",
	pgerrcode.TooManyRows:    "too_many_rows",
	pgerrcode.AssertFailure:  "assert_failure",

	// Class XX — Internal Error
	pgerrcode.InternalError:  "internal_error",
	pgerrcode.DataCorrupted:  "data_corrupted",
	pgerrcode.IndexCorrupted: "index_corrupted",
}

// ResourceSetting names the server setting that err, an error of
// insufficient resources, ran into: "max_connections" (53300, the
// server's connection slots, or those left for non-superusers, are
// taken), "max_wal_senders" (53300 from a replication connection) or
// "max_replication_slots" (53400 from a slot's creation). Any other
// error gives "". Such a fault is the deployment's, not an event's:
// retrying at once only adds to the load.
func ResourceSetting(err error) string {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return ""
	}
	switch pgErr.Code {
	case pgerrcode.TooManyConnections:
		if strings.Contains(pgErr.Message, "max_wal_senders") {
			return "max_wal_senders"
		}
		return "max_connections"
	case pgerrcode.ConfigurationLimitExceeded:
		if strings.Contains(pgErr.Message, "replication slots") {
			return "max_replication_slots"
		}
	}
	return ""
}
