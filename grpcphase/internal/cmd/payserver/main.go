// Command payserver serves the payments test service over gRPC, for the
// tests that kill a server mid-call: it runs the charge workflow against
// the database at $PAYSERVER_DSN, calls the provider at $PAYSERVER_PROVIDER,
// listens on $PAYSERVER_ADDR and prints "ready" once it does.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/atomicphase/atomicphase/grpcphase"
	"github.com/atomicphase/atomicphase/grpcphase/internal/paytest"
	"github.com/atomicphase/atomicphase/phase"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "payserver:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("PAYSERVER_DSN"))
	if err != nil {
		return err
	}
	defer pool.Close()
	w, err := paytest.Workflow(paytest.HTTP{URL: os.Getenv("PAYSERVER_PROVIDER")})
	if err != nil {
		return err
	}
	// PAYSERVER_LEASE sets the lease (a short one, so that a retry takes
	// over a killed server's key soon); unset, the default.
	lease, _ := time.ParseDuration(os.Getenv("PAYSERVER_LEASE"))
	c, err := phase.NewClient(pool, &phase.Config{LeaseTTL: lease,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}, w)
	if err != nil {
		return err
	}
	s, err := grpcphase.NewServer(c, grpcphase.Config{Tenant: paytest.Tenant})
	if err != nil {
		return err
	}
	if err := grpcphase.Handle[*structpb.Struct, *structpb.Struct](s, paytest.Charge, w, grpcphase.MethodConfig[*structpb.Struct]{}); err != nil {
		return err
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(s.UnaryInterceptor()), grpc.StreamInterceptor(s.StreamInterceptor()))
	srv.RegisterService(&paytest.Service, struct{}{})
	lis, err := net.Listen("tcp", os.Getenv("PAYSERVER_ADDR"))
	if err != nil {
		return err
	}
	fmt.Println("ready")
	return srv.Serve(lis)
}
