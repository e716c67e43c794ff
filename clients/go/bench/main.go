// Command bench measures the Go client's speed against a baton node,
// beside the raw protocol (one connection per goroutine, a request and
// its answer at a time) and beside redsync over go-redis against a Redis
// server: acquire+release pairs per second with many goroutines on
// distinct keys, and handoffs per second with as many on one key.
//
//	go run . -baton 127.0.0.1:7373 -redis 127.0.0.1:6379
//
// It is a separate module (redsync and go-redis are its dependencies,
// never the client's), and not a test. The contenders take turns in short
// slices, so that the ratios of one run hold on a machine whose load
// changes; the rates themselves are that machine's.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	baton "github.com/baton-lock/baton/clients/go"
	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	goredislib "github.com/redis/go-redis/v9"
)

var (
	batonAddr = flag.String("baton", "127.0.0.1:7373", "a baton node")
	redisAddr = flag.String("redis", "", "a Redis server for the redsync rows (none: skipped)")
	workers   = flag.Int("workers", 16, "goroutines")
	slices    = flag.Int("slices", 10, "slices per comparison: the contenders take turns, a slice each, so that a machine whose load drifts slows them alike")
	sliceMS   = flag.Int("slice-ms", 300, "milliseconds per slice")
)

// work is one contender: it runs until ctx ends, counting what it did.
// Keys are new in every slice (tag), so that a grant left held when a
// slice ends (its lease runs out) never delays the next slice.
type work func(ctx context.Context, w int, tag string, done *atomic.Int64)

// slice runs w on *workers goroutines for one slice: what it did, and how
// long it took.
func slice(w work, tag string) (int64, time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(*sliceMS)*time.Millisecond)
	defer cancel()
	var done atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for i := 0; i < *workers; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			w(ctx, i, tag, &done)
		}(i)
	}
	wg.Wait()
	return done.Load(), time.Since(start)
}

// compare runs the contenders in turns, a slice each (the order turning
// too), and prints each one's rate over all its slices; the rates.
func compare(title string, names []string, contenders []work) []float64 {
	counts := make([]int64, len(contenders))
	times := make([]time.Duration, len(contenders))
	for s := 0; s < *slices; s++ {
		for k := range contenders {
			i := (k + s) % len(contenders)
			n, d := slice(contenders[i], fmt.Sprintf("%s-%d", title[:4], s))
			counts[i] += n
			times[i] += d
		}
	}
	fmt.Println(title)
	rates := make([]float64, len(contenders))
	for i, name := range names {
		rates[i] = float64(counts[i]) / times[i].Seconds()
		fmt.Printf("  %-40s %10.0f /s\n", name, rates[i])
	}
	return rates
}

func main() {
	flag.Parse()
	log.SetOutput(os.Stderr)
	run := strconv.FormatInt(time.Now().UnixNano(), 36)

	c, err := baton.Dial(context.Background(), []string{*batonAddr})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	var rs *redsync.Redsync
	if *redisAddr != "" {
		client := goredislib.NewClient(&goredislib.Options{Addr: *redisAddr, PoolSize: *workers * 2})
		defer client.Close()
		if err := client.Ping(context.Background()).Err(); err != nil {
			log.Fatalf("redis at %s: %v", *redisAddr, err)
		}
		rs = redsync.New(goredis.NewPool(client))
	}

	rawPairs := func(ctx context.Context, w int, tag string, done *atomic.Int64) {
		rawLoop(ctx, fmt.Sprintf("raw-%s-%s-%d", run, tag, w), done)
	}
	goPairs := func(ctx context.Context, w int, tag string, done *atomic.Int64) {
		key := fmt.Sprintf("go-%s-%s-%d", run, tag, w)
		for ctx.Err() == nil {
			g, err := c.Acquire(ctx, key, 30*time.Second)
			if err != nil {
				return
			}
			if err := g.Release(context.Background()); err != nil {
				log.Fatal(err)
			}
			done.Add(1)
		}
	}
	rsPairs := func(ctx context.Context, w int, tag string, done *atomic.Int64) {
		m := rs.NewMutex(fmt.Sprintf("rs-%s-%s-%d", run, tag, w), redsync.WithExpiry(30*time.Second))
		for ctx.Err() == nil {
			if err := m.LockContext(ctx); err != nil {
				return
			}
			if _, err := m.UnlockContext(context.Background()); err != nil {
				log.Fatal(err)
			}
			done.Add(1)
		}
	}
	rawHand := func(ctx context.Context, w int, tag string, done *atomic.Int64) {
		rawLoop(ctx, "raw-one-"+run+tag, done)
	}
	goHand := func(ctx context.Context, w int, tag string, done *atomic.Int64) {
		for ctx.Err() == nil {
			g, err := c.Acquire(ctx, "go-one-"+run+tag, 30*time.Second)
			if err != nil {
				return
			}
			done.Add(1)
			if err := g.Release(context.Background()); err != nil {
				log.Fatal(err)
			}
		}
	}
	// redsync has no line: a released key goes to whoever asks first, so
	// "handoffs" are acquisitions of the one key, by any goroutine.
	rsHand := func(ctx context.Context, w int, tag string, done *atomic.Int64) {
		m := rs.NewMutex("rs-one-"+run+tag, redsync.WithExpiry(30*time.Second), redsync.WithTries(1<<30))
		for ctx.Err() == nil {
			if err := m.LockContext(ctx); err != nil {
				return
			}
			done.Add(1)
			if _, err := m.UnlockContext(context.Background()); err != nil {
				log.Fatal(err)
			}
		}
	}

	names := []string{"raw protocol", "Go client"}
	pairs := []work{rawPairs, goPairs}
	hands := []work{rawHand, goHand}
	if rs != nil {
		names = append(names, "redsync (go-redis)")
		pairs = append(pairs, rsPairs)
		hands = append(hands, rsHand)
	}
	title := fmt.Sprintf("acquire+release pairs, %d goroutines on distinct keys:", *workers)
	p := compare(title, names, pairs)
	title = fmt.Sprintf("handoffs, %d goroutines on one key:", *workers)
	h := compare(title, names, hands)
	fmt.Printf("Go client / raw protocol: pairs %.2fx, handoffs %.2fx\n", p[1]/p[0], h[1]/h[0])
	if rs != nil {
		fmt.Printf("Go client / redsync: pairs %.2fx, handoffs %.2fx\n", p[1]/p[2], h[1]/h[2])
	}
}

// rawLoop acquires and releases key over a connection of its own, one
// request and its answer at a time: the protocol with no client around it.
func rawLoop(ctx context.Context, key string, done *atomic.Int64) {
	nc, err := net.Dial("tcp", *batonAddr)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	go func() {
		<-ctx.Done()
		nc.SetDeadline(time.Now())
	}()
	r := bufio.NewReader(nc)
	acquire := []byte("A " + key + " 30 0\n")
	var release []byte
	for ctx.Err() == nil {
		if _, err := nc.Write(acquire); err != nil {
			return
		}
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		f := strings.Fields(line)
		if len(f) < 3 || f[0] != "A" {
			log.Fatalf("raw: %q", line)
		}
		release = append(release[:0], "R "+key+" "+f[1]+"\n"...)
		if _, err := nc.Write(release); err != nil {
			return
		}
		if line, err = r.ReadString('\n'); err != nil {
			return
		}
		if !strings.HasPrefix(line, "R ") {
			log.Fatalf("raw: %q", line)
		}
		done.Add(1)
	}
}
