// Command dial makes RunFunction calls as Crossplane core makes them
// (internal/xfn's PackagedFunctionRunner): grpc-go, a target
// `dns:///NAME.NAMESPACE:9443` as a FunctionRevision's status.endpoint says,
// credentials.NewTLS with the client certificate core's init issues from
// the CA and no ServerName (the SNI is the target's host), round_robin and
// waitForReady from core's service config, and v1 falling back to v1beta1
// on Unimplemented. Only name resolution differs: every name resolves to
// -address, as a headless Service's DNS would resolve it to the pod.
//
// The request is a v1 RunFunctionRequest in protojson on stdin; each call's
// response is printed as one protojson line on stdout. A failed call prints
// "code=CODE: MESSAGE" on stderr and exits 2.
//
// xfn's tests build it (scripts/peers.sh) and drive it: tests/host_peers.rs.
package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	fnv1 "github.com/crossplane/function-sdk-go/proto/v1"
	fnv1beta1 "github.com/crossplane/function-sdk-go/proto/v1beta1"
)

// Core's service config (internal/xfn/function_runner.go, svcConfig).
const serviceConfig = `{
	"loadBalancingConfig": [{"round_robin": {}}],
	"methodConfig": [{"name": [{}], "waitForReady": true}]
}`

// fixed resolves every name of its scheme to one address.
type fixed struct{ address string }

func (f fixed) Scheme() string { return "dns" }

func (f fixed) Build(_ resolver.Target, cc resolver.ClientConn, _ resolver.BuildOptions) (resolver.Resolver, error) {
	err := cc.UpdateState(resolver.State{Addresses: []resolver.Address{{Addr: f.address}}})
	return f, err
}

func (fixed) ResolveNow(resolver.ResolveNowOptions) {}
func (fixed) Close()                                {}

func main() {
	target := flag.String("target", "", "the endpoint, as core reads it from status.endpoint (dns:///NAME.NAMESPACE:9443)")
	address := flag.String("address", "", "HOST:PORT every name resolves to")
	ca := flag.String("ca", "", "the CA certificate (tls.crt of crossplane-root-ca); none: plaintext")
	cert := flag.String("cert", "", "the client certificate")
	key := flag.String("key", "", "the client key")
	version := flag.String("version", "fallback", "v1, v1beta1, or fallback (v1, then v1beta1 on Unimplemented, as core)")
	calls := flag.Int("calls", 1, "calls to make on the one connection, one after the other")
	timeout := flag.Duration("timeout", 60*time.Second, "each call's deadline")
	flag.Parse()
	if *target == "" || *address == "" {
		fail(codes.InvalidArgument, "-target and -address are required")
	}
	resolver.Register(fixed{address: *address})

	creds := insecure.NewCredentials()
	if *ca != "" {
		pem, err := os.ReadFile(*ca)
		if err != nil {
			fail(codes.InvalidArgument, err.Error())
		}
		roots := x509.NewCertPool()
		if !roots.AppendCertsFromPEM(pem) {
			fail(codes.InvalidArgument, "no certificate in "+*ca)
		}
		pair, err := tls.LoadX509KeyPair(*cert, *key)
		if err != nil {
			fail(codes.InvalidArgument, err.Error())
		}
		creds = credentials.NewTLS(&tls.Config{
			RootCAs:      roots,
			Certificates: []tls.Certificate{pair},
			MinVersion:   tls.VersionTLS12,
		})
	}
	conn, err := grpc.NewClient(*target, grpc.WithTransportCredentials(creds), grpc.WithDefaultServiceConfig(serviceConfig))
	if err != nil {
		fail(codes.InvalidArgument, err.Error())
	}
	defer conn.Close()

	input, err := io.ReadAll(bufio.NewReader(os.Stdin))
	if err != nil {
		fail(codes.InvalidArgument, err.Error())
	}
	req := &fnv1.RunFunctionRequest{}
	if err := protojson.Unmarshal(input, req); err != nil {
		fail(codes.InvalidArgument, "the request: "+err.Error())
	}
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	for i := 0; i < *calls; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), *timeout)
		rsp, err := call(ctx, conn, *version, req)
		cancel()
		if err != nil {
			out.Flush()
			fail(status.Code(err), status.Convert(err).Message())
		}
		line, err := protojson.Marshal(rsp)
		if err != nil {
			fail(codes.Internal, err.Error())
		}
		fmt.Fprintf(out, "%s\n", line)
		out.Flush()
	}
}

// call sends req as version says.
func call(ctx context.Context, conn *grpc.ClientConn, version string, req *fnv1.RunFunctionRequest) (*fnv1.RunFunctionResponse, error) {
	if version != "v1beta1" {
		rsp, err := fnv1.NewFunctionRunnerServiceClient(conn).RunFunction(ctx, req)
		if version == "v1" || status.Code(err) != codes.Unimplemented {
			return rsp, err
		}
	}
	// v1beta1's messages are v1's on the wire.
	breq := &fnv1beta1.RunFunctionRequest{}
	if err := convert(req, breq); err != nil {
		return nil, err
	}
	brsp, err := fnv1beta1.NewFunctionRunnerServiceClient(conn).RunFunction(ctx, breq)
	if err != nil {
		return nil, err
	}
	rsp := &fnv1.RunFunctionResponse{}
	return rsp, convert(brsp, rsp)
}

func convert(from, to proto.Message) error {
	b, err := proto.Marshal(from)
	if err != nil {
		return err
	}
	return proto.Unmarshal(b, to)
}

func fail(code codes.Code, message string) {
	fmt.Fprintf(os.Stderr, "code=%s: %s\n", code, message)
	os.Exit(2)
}
