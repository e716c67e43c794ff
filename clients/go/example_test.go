package baton_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	baton "github.com/baton-lock/baton/clients/go"
)

// Each example needs a batond listening on 127.0.0.1:7373; go test
// compiles them but does not run them.

// A lock around a job: wait up to 10 s in line; the grant lasts 30 s
// unless released (or kept). Hand the token to the resource the lock
// protects: it rejects a token not above the last one it accepted.
func ExampleClient_Acquire() {
	c, err := baton.New([]string{"127.0.0.1:7373"})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	g, err := c.Acquire(ctx, "nightly-report", 30*time.Second, baton.Wait(10*time.Second))
	if errors.Is(err, baton.ErrTimeout) {
		log.Print("someone else is writing the report")
		return
	}
	if err != nil {
		log.Fatal(err)
	}
	defer g.Release(ctx)
	fmt.Println("writing the report, fenced with token", g.Token())
}

// Only if nobody holds the key now.
func ExampleClient_TryAcquire() {
	c, _ := baton.New([]string{"127.0.0.1:7373"})
	defer c.Close()
	ctx := context.Background()
	g, err := c.TryAcquire(ctx, "cron:cleanup", time.Minute)
	if err != nil {
		fmt.Println("not now:", err)
		return
	}
	defer g.Release(ctx)
	fmt.Println("cleaning up")
}

// A held lock is kept alive in the background and says at once when it
// is lost: stop the work then.
func ExampleClient_Hold() {
	c, _ := baton.New([]string{"10.0.0.1:7373", "10.0.0.2:7373"})
	defer c.Close()
	ctx := context.Background()
	g, err := c.Hold(ctx, "reindex", 10*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	defer g.Release(ctx)
	for step := 0; step < 100; step++ {
		select {
		case <-g.Done():
			log.Printf("lost the lock: %v", g.Err())
			return
		default:
		}
		// ... one step of work, fenced with g.Token() ...
	}
}

// A semaphore: at most 4 encoders at once, each in its own slot.
func ExampleLimit() {
	c, _ := baton.New([]string{"127.0.0.1:7373"})
	defer c.Close()
	ctx := context.Background()
	g, err := c.Hold(ctx, "encoders", 10*time.Second, baton.Limit(4), baton.Value("host-a"))
	if err != nil {
		log.Fatal(err)
	}
	defer g.Release(ctx)
	fmt.Println("encoding in slot", g.Slot())
}

// An election: run for leader, and lead until leadership is lost or
// given up.
func ExampleClient_Campaign() {
	c, _ := baton.New([]string{"127.0.0.1:7373"})
	defer c.Close()
	ctx := context.Background()
	lead, err := c.Campaign(ctx, "scheduler", "10.0.0.5:8080", 5*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("leading with token", lead.Token())
	select {
	case <-lead.Done():
		log.Printf("no longer leading: %v", lead.Err())
	case <-time.After(time.Minute):
		lead.Release(ctx) // resign
	}
}

// Who leads now, and each change of leader.
func ExampleClient_Observe() {
	c, _ := baton.New([]string{"127.0.0.1:7373"})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	now, err := c.Leader(ctx, "scheduler")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("leader now:", now.Value)
	leaders, _ := c.Observe(ctx, "scheduler")
	for s := range leaders {
		if s.Token == 0 {
			fmt.Println("nobody leads")
			continue
		}
		fmt.Println("new leader:", s.Value)
	}
}

// A watch of a key's holders, which survives failover.
func ExampleClient_Watch() {
	c, _ := baton.New([]string{"127.0.0.1:7373"})
	defer c.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	states, _ := c.Watch(ctx, "encoders")
	for s := range states {
		fmt.Printf("%d of 4 busy, %d waiting\n", s.Holders, s.Waiting)
	}
}

// Errors are sentinels for errors.Is, or a *RefusedError with the
// server's reason word.
func ExampleRefusedError() {
	c, _ := baton.New([]string{"127.0.0.1:7373"})
	defer c.Close()
	_, err := c.Acquire(context.Background(), "encoders", time.Minute, baton.Limit(8))
	var refused *baton.RefusedError
	switch {
	case errors.As(err, &refused) && refused.Reason == "limit-mismatch":
		fmt.Println("the key is in use with another limit")
	case errors.Is(err, baton.ErrUnavailable):
		fmt.Println("no server answered; try again later")
	}
}
