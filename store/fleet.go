package store

// Claim is one replica's claim on one group: a capacity that the replicas
// of a fleet share (an RLQS limit), divided by the expected usages of
// every replica's proxies (quota.Divider.Level: max-min fairly when each
// proxy's demands are all equal). quota.Fleet exchanges claims; store/redis's Demand
// holds them. It is plain data.
type Claim struct {
	// Capacity is what the fleet divides: the limit less the reserve.
	Capacity float64
	// Max bounds the part claimed: a replica's first claim of a group
	// takes at most an equal part per live replica, since the replicas
	// that got the group at the same time have not published yet.
	Max float64
	// Demands are the recent demands of this replica's proxies.
	Demands []Demand
}

// Demand is a proxy's demand over its recent reports: the lowest, the
// mean and the peak. A demand of one value has all three equal. It is
// plain data.
type Demand struct{ Low, Mean, Peak float64 }

// Grants is the outcome of one exchange of claims with the fleet. It is
// plain data.
type Grants struct {
	// Granted is this replica's part of each group whose claim succeeded.
	Granted map[string]float64
	// Live is the number of replicas alive in the fleet, this one
	// included; 0 when unknown (the membership could not be read).
	Live int
}
