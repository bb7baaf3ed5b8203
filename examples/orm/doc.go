// Package orm shows Lease.GuardSQL with GORM and sqlx, the ORMs of
// database/sql: its examples (example_orm_test.go) are run by its tests
// against a real PostgreSQL. It is a module of its own, so that GORM and
// sqlx never enter the library's module graph; nothing imports it.
package orm
